"""What the scheduler stores in Redis: job records and node conditions."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from whaleflux.shared.events import JobSubmitted

JobStateName = Literal["pending", "placed", "running", "succeeded", "failed", "rejected"]
TERMINAL = {"succeeded", "failed", "rejected"}
ACTIVE = {"placed", "running"}


class JobRecord(BaseModel):
    job_id: str
    spec: JobSubmitted
    state: JobStateName = "pending"
    reason: str | None = None
    attempt: int = 0
    cluster: str | None = None
    node: str | None = None
    gpu_model: str | None = None
    gpu_uuids: list[str] = Field(default_factory=list)
    submitted_at: datetime
    placed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    # Placement explanation and the policy's estimate of the end (epoch seconds), for `jobs why` and backfill.
    placed_because: str | None = None
    expected_end: float | None = None
    preemptions: int = 0
    # One line per attempt that was stopped or lost and requeued ("attempt 1 on h100-01: node lost ...").
    requeues: list[str] = Field(default_factory=list)


NodeConditionName = Literal["lost", "draining"]


class NodeCondition(BaseModel):
    """A node the scheduler took out of placement: lost (silent too long) or draining (asked to)."""

    state: NodeConditionName
    reason: str
    since: datetime
