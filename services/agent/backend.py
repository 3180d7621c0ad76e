"""The interface every GPU backend of the agent implements (NVML or simulated)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from whaleflux.shared.events import GpuIdentity, GpuSample


class GpuBackend(Protocol):
    def identities(self) -> list[GpuIdentity]:
        """What inventory needs to know about each GPU; stable across calls."""

    def sample(self, now: datetime) -> list[GpuSample]:
        """One sample of every GPU; unsupported metrics are None, never 0."""

    def job_started(self, gpu_uuids: list[str], job_id: str) -> None:
        """A job's process now uses these GPUs (the simulator loads them; NVML ignores it)."""

    def job_stopped(self, gpu_uuids: list[str]) -> None:
        """The job's process on these GPUs has exited."""
