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

    def job_started(self, gpu_uuids: list[str], job_id: str, pid: int | None = None) -> None:
        """A job's process (session leader `pid`) now uses these GPUs.

        The simulator loads them; NVML maps the processes it sees to the job by PID.
        """

    def job_stopped(self, gpu_uuids: list[str]) -> None:
        """The job's process on these GPUs has exited."""
