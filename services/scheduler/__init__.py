"""WhaleFlux scheduler."""
