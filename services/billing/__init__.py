"""WhaleFlux billing."""
