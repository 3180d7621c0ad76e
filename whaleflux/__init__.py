"""WhaleFlux: GPU fleet manager."""

__version__ = "0.1.0"
