"""WhaleFlux inventory."""
