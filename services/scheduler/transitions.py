"""A job record's transitions that others must hear about, and the events that announce them. Pure (no I/O).

The store commits each transition together with its events (staged in the
outbox in the same MULTI); the event ids are fixed by (job, attempt, rank),
so a crash neither loses nor doubles one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from whaleflux.shared import subjects
from whaleflux.shared.events import EventData, JobCancelled, JobPlaced, JobPreempted, JobRejected, JobRequeued

from .gang import parts_of
from .history import back_to_queue, record_cancel
from .placement import Placement
from .queueing.jobs import estimate_left
from .records import ACTIVE, JobRecord

# (rank, cluster, node) of one part of an attempt.
PartAt = tuple[int, str, str]


@dataclass(frozen=True)
class Announcement:
    """An event to stage: its subject, payload and fixed id."""

    subject: str
    data: EventData
    event_id: str


@dataclass(frozen=True)
class Requeued:
    """A job sent back to the queue: the GPUs it released, the parts of the attempt, its job.requeued."""

    released: list[str]
    parts: list[PartAt]
    event: Announcement


def part_event_id(kind: str, job_id: str, attempt: int, rank: int) -> str:
    """The outbox id of an event about one part of an attempt: rank 0 (and a one-node job) keeps the plain id."""
    return f"{kind}-{job_id}-{attempt}" + (f"-r{rank}" if rank else "")


def place(job: JobRecord, p: Placement, now: datetime, expected_end: float | None,
          start_within_s: float | None = None) -> list[Announcement]:
    """The job's record as placed (changed in place) and its job.placed events (one per node of a gang); with
    `start_within_s`, each carries a start_by that long after `now`, after which its node never starts it."""
    job.attempt += 1
    job.state, job.reason, job.placed_at = "placed", None, now
    job.start_by = now + timedelta(seconds=start_within_s) if start_within_s is not None else None
    job.parts = parts_of(p)
    job.cluster, job.node, job.gpu_model = p.cluster, p.node, p.model
    job.gpu_uuids = [u for s in p.shares for u in s.gpu_uuids]
    job.started_at = job.finished_at = job.exit_code = job.held_until = None
    job.placed_because, job.expected_end = p.explanation or None, expected_end
    spec = job.spec
    gang = [s.node for s in p.shares] if job.parts else None
    events = []
    for rank, share in enumerate(p.shares):
        event = JobPlaced(
            job_id=job.job_id,
            attempt=job.attempt,
            cluster=share.cluster,
            node=share.node,
            gpu_model=share.model,
            gpu_uuids=list(share.gpu_uuids),
            gpu_indices=list(share.gpu_indices),
            command=spec.command,
            env=spec.env,
            workdir=spec.workdir,
            team=spec.team,
            project=spec.project,
            checkpoint_dir=spec.checkpoint_dir,
            # A later attempt resumes from the checkpoint unless the job asked to start over.
            resume=job.attempt > 1 and spec.resume == "checkpoint",
            rank=rank if gang else None,
            gang_nodes=gang,
            gang_gpus=len(job.gpu_uuids) if gang else None,
            start_by=job.start_by,
        )
        event_id = part_event_id("placed", job.job_id, job.attempt, rank)
        events.append(Announcement(subjects.job_placed(share.cluster, share.node), event, event_id))
    return events


def stop_orders(job: JobRecord, parts: list[PartAt], reason: str, grace_s: float,
                kind: str = "preempted") -> list[Announcement]:
    """A job.preempted stop order to each (rank, cluster, node) of the current attempt."""
    out = []
    for rank, cluster, node in parts:
        order = JobPreempted(job_id=job.job_id, attempt=job.attempt, cluster=cluster, node=node, reason=reason,
                             grace_s=grace_s)
        event_id = part_event_id(kind, job.job_id, job.attempt, rank)
        out.append(Announcement(subjects.job_preempted(cluster, node), order, event_id))
    return out


def reject(job: JobRecord, reason: str) -> Announcement:
    """A job that can never run is rejected with its reason (changed in place), never queued forever."""
    job.state, job.reason = "rejected", reason
    return Announcement(subjects.JOB_REJECTED, JobRejected(job_id=job.job_id, reason=reason), f"rejected-{job.job_id}")


def cancel(job: JobRecord, reason: str, by: str | None, grace_s: float, now: datetime) -> list[Announcement]:
    """The job cancelled (changed in place): its current attempt, if it holds GPUs, told to stop on every node
    (before anything reuses them: the outbox keeps order), then its job.cancelled. Nothing if it has ended."""
    parts = [(p.rank, p.cluster, p.node) for p in job.parts] or [(0, job.cluster or "", job.node or "")]
    stopping = job.state in ACTIVE
    if not record_cancel(job, reason, now):
        return []
    orders = stop_orders(job, parts, f"cancelled: {reason}", grace_s, "cancel") if stopping else []
    event = JobCancelled(job_id=job.job_id, attempt=job.attempt, reason=reason, cancelled_by=by)
    return [*orders, Announcement(subjects.JOB_CANCELLED, event, f"cancelled-{job.job_id}")]


def requeue(job: JobRecord, cause: str, reason: str, hold_until: datetime | None, moved: bool,
            now: datetime) -> Requeued:
    """Back to the queue (changed in place): see `SchedulerStore.requeue`. A job the policy preempted (not moved)
    that resumes from its checkpoint keeps as its estimate what the stopped attempt left of it, so the policy
    does not take it for longer than it is (reservations, shortest remaining first)."""
    left = None
    if cause == "preempted" and not moved and job.spec.resume == "checkpoint" and job.placed_at is not None:
        left = estimate_left(job.estimate_s, job.placed_at.timestamp(), job.expected_end, now.timestamp())
        job.estimate_left_s = left
    attempt, cluster, node = job.attempt, job.cluster, job.node
    held = list(job.gpu_uuids)
    parts = [(p.rank, p.cluster, p.node) for p in job.parts] or [(0, cluster or "", node or "")]
    gang = [p.node for p in job.parts] or None
    where = f"{node}" if not gang else f"{', '.join(gang)} (gang)"
    back_to_queue(job, f"attempt {attempt} on {where}: {reason}", reason, "" if moved else cause, hold_until)
    if hold_until is not None:
        job.reason = f"{job.reason}; placed again once attempt {attempt} has stopped on {where}"
    if moved:
        job.migrations += 1
        job.reason = f"moved: {(job.reason or '').removeprefix('requeued: ')}"
    requeued = JobRequeued(job_id=job.job_id, attempt=attempt, cluster=cluster, node=node, reason=reason, cause=cause,
                           gang_nodes=gang, estimate_left_s=left)
    return Requeued(held, parts, Announcement(subjects.JOB_REQUEUED, requeued, f"requeued-{job.job_id}-{attempt}"))
