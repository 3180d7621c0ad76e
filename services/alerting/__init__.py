"""WhaleFlux alerting."""
