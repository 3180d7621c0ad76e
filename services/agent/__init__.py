"""WhaleFlux agent."""
