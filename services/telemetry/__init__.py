"""WhaleFlux telemetry."""
