"""What the scheduler stores in Redis: job records, node conditions and GPU quarantines."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from whaleflux.shared.events import GpuCordonCause, JobSubmitted

JobStateName = Literal["pending", "placed", "running", "succeeded", "failed", "rejected", "cancelled"]
TERMINAL = {"succeeded", "failed", "rejected", "cancelled"}
ACTIVE = {"placed", "running"}


class JobPart(BaseModel):
    """One node's share of a gang that spans nodes, and how far its process got (rank 0 first)."""

    rank: int
    cluster: str
    node: str
    gpu_model: str
    gpu_uuids: list[str]
    gpu_indices: list[int]
    state: Literal["placed", "running", "exited"] = "placed"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None


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

    def holds(self, cluster: str, node: str) -> bool:
        """Whether the current attempt holds GPUs on that node."""
        if self.parts:
            return any(p.cluster == cluster and p.node == node for p in self.parts)
        return self.cluster == cluster and self.node == node


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
