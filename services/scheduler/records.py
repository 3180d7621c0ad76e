"""What the scheduler stores in Redis: job records, node conditions and GPU quarantines.

A job record is also what its API serves and the console reads: that model lives in `shared.contracts.jobs`
(one source for both), re-exported here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from whaleflux.shared.contracts.jobs import ENDED, JobPart, JobRecord, JobStateName
from whaleflux.shared.events import GpuCordonCause

__all__ = ["ACTIVE", "TERMINAL", "GpuQuarantine", "JobPart", "JobRecord", "JobStateName", "NodeCondition",
           "NodeConditionName"]

TERMINAL = set(ENDED)
ACTIVE = {"placed", "running"}


NodeConditionName = Literal["lost", "draining", "unhealthy"]


class NodeCondition(BaseModel):
    """A node the scheduler took out of placement: lost (silent too long), draining (asked to) or unhealthy (its
    agent says it takes no new work, and why: a full disk; it keeps its jobs, and is back once it says so)."""

    state: NodeConditionName
    reason: str
    since: datetime


class GpuQuarantine(BaseModel):
    """A GPU the scheduler places nothing new on: an operator's cordon, or a fault it saw (see `quarantine.py`)."""

    cluster: str
    node: str
    uuid: str
    index: int
    cause: GpuCordonCause
    reason: str
    since: datetime
    # A fault's quarantine ends once the GPU has reported healthy this long without a break (`hold_s`).
    healthy_since: datetime | None = None
    # The critical alerts firing on the GPU (fingerprint -> rule): while any fires it stays out, whatever else
    # lifts its quarantine except an operator's uncordon (an undrain with --force).
    alerts: dict[str, str] = Field(default_factory=dict)

    @property
    def node_key(self) -> str:
        return f"{self.cluster}/{self.node}"
