"""The WhaleFlux version every process reports (agents in node.registered, services in their OpenAPI docs)."""

from __future__ import annotations

__version__ = "0.1.0"
