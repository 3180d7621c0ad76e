"""Allocation bookkeeping: what a job event queues, opens or closes, and which GPUs a sample finds held. No I/O.

`job.placed` (envelope `time` = when the scheduler allocated) opens an
allocation `<job>:<attempt>` on its GPUs; `job.finished` / `job.failed` close
it at `finished_at` / `failed_at`. Either may arrive first. Each node of a
gang spanning nodes is its own allocation `<job>:<attempt>#r<rank>` (rank 0
keeps `<job>:<attempt>`), closed by that part's end. Which part holds a GPU
now is the shared GPU-holder fold's (shared.contracts.holders).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from whaleflux.shared.contracts import Holder
from whaleflux.shared.events import Envelope, EventData, JobFailed, JobFinished, JobPlaced, JobRejected, JobSubmitted

from .findings import QueuedJob
from .rollups import Allocation


def allocation_key(job_id: str, attempt: int, rank: int | None = None) -> str:
    """One allocation per attempt, and per node of a gang spanning nodes (each part ends on its own)."""
    return f"{job_id}:{attempt}" + (f"#r{rank}" if rank else "")


@dataclass(frozen=True)
class JobChange:
    """What one job event changes: a job queued or no longer queued, an allocation opened or closed."""

    queued: QueuedJob | None = None
    dequeued: str | None = None
    opened: Allocation | None = None
    closed: tuple[str, datetime] | None = None  # allocation key, end


def job_change(env: Envelope, data: EventData) -> JobChange:
    """The bookkeeping of one job event (nothing for the others)."""
    if isinstance(data, JobSubmitted):
        return JobChange(queued=QueuedJob(data.job_id, data.gpus, tuple(data.gpu_models), data.expected_runtime_s))
    if isinstance(data, JobRejected):
        return JobChange(dequeued=data.job_id)
    if isinstance(data, JobPlaced):
        key = allocation_key(data.job_id, data.attempt, data.rank)
        return JobChange(dequeued=data.job_id, opened=Allocation(key, tuple(data.gpu_uuids), env.time))
    if isinstance(data, (JobFinished, JobFailed)):
        end = data.finished_at if isinstance(data, JobFinished) else data.failed_at
        return JobChange(closed=(allocation_key(data.job_id, data.attempt, data.rank), end))
    return JobChange()


def allocated_at(holders: Mapping[str, Holder], uuids: Iterable[str], t: datetime) -> set[str]:
    """The GPUs among `uuids` held (shared.contracts.holders) since `t` (a sample time) or before."""
    return {u for u in uuids if (h := holders.get(u)) is not None and h.since <= t}
