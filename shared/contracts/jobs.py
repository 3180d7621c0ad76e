"""The scheduler's job records as its HTTP API serves them (`GET /v1/jobs`, `GET /v1/jobs/{id}`,
`GET /v1/jobs/{id}/why`), and as the console reads them: one model on both sides, so a renamed or retyped
field fails the type check or a test of the reader, not a page.

The scheduler also stores a job in Redis in this shape (`whaleflux.scheduler.records` re-exports it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from whaleflux.shared.job_events import JobSubmitted

JobStateName = Literal["pending", "placed", "running", "succeeded", "failed", "rejected", "cancelled"]
JOB_STATES: tuple[JobStateName, ...] = ("pending", "placed", "running", "succeeded", "failed", "rejected",
                                         "cancelled")
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "rejected", "cancelled"})
PartStateName = Literal["placed", "running", "exited"]


class JobPart(BaseModel):
    """One node's share of a gang that spans nodes, and how far its process got (rank 0 first)."""

    rank: int
    cluster: str
    node: str
    gpu_model: str
    gpu_uuids: list[str]
    gpu_indices: list[int]
    state: PartStateName = "placed"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None


class JobRecord(BaseModel):
    """A job: what was asked (`spec`), where it stands, and what happened to its earlier attempts."""

    # A reader tolerates fields added later (a new field is not a breaking change).
    model_config = ConfigDict(extra="ignore")

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
    # The current attempt's fencing token (job.placed's start_by): its node never starts it later than this.
    # None: placed by a scheduler that set none (its node may start it whenever the placement reaches it).
    start_by: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    # Placement explanation and the policy's estimate of the end (epoch seconds), for `jobs why` and backfill.
    placed_because: str | None = None
    expected_end: float | None = None
    preemptions: int = 0
    # After a preemption of a job that resumes from its checkpoint: its estimate (A100 s) less the share of
    # the stopped attempt's expected length that ran (`queueing.jobs.estimate_left`); None: the spec's.
    estimate_left_s: float | None = None
    # One line per attempt that was stopped or lost and requeued ("attempt 1 on h100-01: node lost ...").
    requeues: list[str] = Field(default_factory=list)
    # Times the queue policy moved it (checkpoint-restart to faster GPUs, or out of a blocked job's
    # way); the policy stops at `max_migrations_per_job`, so a job is never moved back and forth.
    migrations: int = 0
    # A moved job is not placed again while its stopped attempt may still run (and write its
    # checkpoint): until the agent reports that attempt's end, or until this time at the latest.
    held_until: datetime | None = None
    # The attempt given up on because its node went silent or stopped listing it. If it reports its
    # own end after all (the agent was only partitioned or restarting), that end is the job's.
    lost_attempt: int | None = None
    # A gang spanning nodes: one part per node of the current attempt, rank 0 first (`node`,
    # `gpu_model` are rank 0's, `gpu_uuids` all of the gang's). Empty for a job on one node.
    parts: list[JobPart] = Field(default_factory=list)

    @property
    def estimate_s(self) -> float | None:
        """The runtime estimate the queue policy sees: what a preemption left of it, else the spec's."""
        return self.spec.expected_runtime_s if self.estimate_left_s is None else self.estimate_left_s

    @property
    def nodes(self) -> list[str]:
        """The nodes the current attempt holds GPUs on, rank 0 first."""
        return [p.node for p in self.parts] if self.parts else [self.node] if self.node else []

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def holds(self, cluster: str, node: str) -> bool:
        """Whether the current attempt holds GPUs on that node."""
        if self.parts:
            return any(p.cluster == cluster and p.node == node for p in self.parts)
        return self.cluster == cluster and self.node == node


class JobWhy(BaseModel):
    """`GET /v1/jobs/{id}/why`: why the job is where it is, in words (`scheduler.why`)."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    state: JobStateName
    attempt: int = 0
    why: str
    why_key: str = Field("", description="changes when the reason does, not when only the clock moves")
