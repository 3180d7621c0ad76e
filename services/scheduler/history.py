"""A job's whole history folded into its record: what a rebuild decides from. Pure (no I/O, no clock).

The JOBS stream holds every fact about a job: its submission, each placement
(one job.placed per node of a gang), what the nodes reported (started,
finished, failed), and the scheduler's own requeues, rejections and
cancellations. Folding them in stream order gives the record the live
scheduler would have kept, so after a lost store a finished or cancelled job
stays so (never dispatched again), a
job whose attempt still runs stays placed or running on that node (re-adopted,
not restarted), and only the truly pending wait in the queue. Folding the same
events twice gives the same records.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import TypeAdapter

from whaleflux.shared.events import (
    Envelope,
    EventData,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobRequeued,
    JobStarted,
    JobSubmitted,
)

from .gang import on_part_report
from .records import ACTIVE, TERMINAL, JobPart, JobRecord

_RECORDS = TypeAdapter(list[JobRecord])
# Requeue causes that give an attempt up without stopping it: it may still end on its own.
LOST = ("node_lost", "attempt_lost")


@dataclass(frozen=True)
class EndDecision:
    """What an attempt's end means for the job: `requeue` (with `cause`, `reason`) or `terminal`."""

    requeue: bool
    cause: str = ""
    reason: str = ""


def after_end(job: JobRecord, report: JobFinished | JobFailed, max_restarts: int) -> EndDecision:
    """The current attempt of a job on one node ended: requeue it, or is the job done?

    A planned stop by the node (its agent or `up` shut down) is not the job's
    failure: the job is requeued to resume, whatever the exit code the stop caused.
    """
    if isinstance(report, JobFinished) and report.interrupted:
        return EndDecision(True, "interrupted", f"interrupted: {report.interrupted}")
    ok = isinstance(report, JobFinished) and report.exit_code == 0
    if not ok and job.spec.restart_on_failure and len(job.requeues) < max_restarts:
        why = report.reason if isinstance(report, JobFailed) else f"exit code {report.exit_code}"
        return EndDecision(True, "restart_on_failure", f"failed ({why}), restarting")
    return EndDecision(False)


def record_end(job: JobRecord, report: JobFinished | JobFailed) -> None:
    """The job's terminal state from its current attempt's end (one node)."""
    if isinstance(report, JobFinished):
        job.state = "succeeded" if report.exit_code == 0 else "failed"
        job.exit_code, job.finished_at = report.exit_code, report.finished_at
        job.started_at = job.started_at or report.started_at
    else:
        job.state, job.reason = "failed", report.reason
        job.exit_code, job.finished_at = report.exit_code, report.failed_at


def late_end(job: JobRecord, report: EventData) -> bool:
    """A lost attempt of a job on one node reported its own end after all (not a stop): that end decides the job,
    as if it had arrived in time, instead of running the job again."""
    if not isinstance(report, (JobFinished, JobFailed)) or (isinstance(report, JobFinished) and report.interrupted):
        return False
    return job.state == "pending" and not job.parts and job.lost_attempt == report.attempt == job.attempt


def from_attempt_node(job: JobRecord, report: JobStarted | JobFinished | JobFailed) -> bool:
    """Whether a report about the job's current attempt names a node that attempt was placed on. NATS lets a node
    report only on its own subject, and the consumer holds the data to it, so another node's report about this
    attempt is a forgery or a mix-up: it must not start, end or release an attempt that runs elsewhere. Reports
    about other attempts are the other guards' (they change nothing). A gang requeued keeps no parts: its other
    ranks' ends (which release its hold) cannot be told apart by node and are taken."""
    if report.attempt != job.attempt:
        return True
    if job.parts:
        return any(p.cluster == report.cluster and p.node == report.node for p in job.parts)
    if report.rank:
        return True
    return job.cluster == report.cluster and job.node == report.node


def record_cancel(job: JobRecord, reason: str, at: datetime) -> bool:
    """The job cancelled (changed in place) unless it has ended already; whether it was. Its GPUs stay
    listed (where it ran), the allocation is released by the caller."""
    if job.state in TERMINAL:
        return False
    job.state, job.reason, job.finished_at = "cancelled", f"cancelled: {reason}", at
    job.held_until = job.lost_attempt = job.expected_end = None
    return True


def back_to_queue(job: JobRecord, line: str, reason: str, cause: str, hold_until: datetime | None) -> None:
    """The current attempt is over without ending the job: pending again, GPUs released."""
    job.lost_attempt = job.attempt if cause in LOST else None
    job.requeues.append(line)
    job.state, job.reason = "pending", f"requeued: {reason}"
    if cause == "preempted":
        job.preemptions += 1
    job.gpu_uuids, job.parts, job.expected_end = [], [], None
    job.held_until = hold_until


class Fold:
    """Jobs built up event by event; `hold_s`: how long a stopped attempt may take to end (as the live
    scheduler's `stop_hold`), `max_restarts`: as the live setting."""

    def __init__(self, hold_s: float, max_restarts: int):
        self.hold_s = hold_s
        self.max_restarts = max_restarts
        self.jobs: dict[str, JobRecord] = {}
        # Attempts whose end was reported (a stop order's hold is over once it is).
        self._ended: set[tuple[str, int]] = set()

    def apply(self, env: Envelope, data: EventData) -> None:
        if isinstance(data, JobSubmitted):
            self.jobs.setdefault(data.job_id, JobRecord(job_id=data.job_id, spec=data, submitted_at=env.time))
            return
        job = self.jobs.get(getattr(data, "job_id", ""))
        if job is None:
            return  # its submission is older than the stream keeps: nothing to decide about it
        if isinstance(data, JobRejected):
            if job.state == "pending":
                job.state, job.reason = "rejected", data.reason
        elif isinstance(data, JobPlaced):
            self._placed(job, env, data)
        elif isinstance(data, (JobStarted, JobFinished, JobFailed)):
            self._report(job, data)
        elif isinstance(data, JobRequeued):
            self._requeued(job, env, data)
        elif isinstance(data, JobCancelled):
            record_cancel(job, data.reason, env.time)

    def _placed(self, job: JobRecord, env: Envelope, p: JobPlaced) -> None:
        if p.attempt < job.attempt or job.state in ("succeeded", "rejected", "cancelled"):
            return
        if p.attempt > job.attempt:
            job.attempt, job.state, job.reason, job.placed_at = p.attempt, "placed", None, env.time
            job.start_by = p.start_by
            job.parts, job.gpu_uuids = [], []
            job.started_at = job.finished_at = job.exit_code = job.held_until = None
            job.cluster, job.node = p.cluster, (p.gang_nodes or [p.node])[0]
        if p.gang_nodes:
            if any(part.rank == p.part for part in job.parts):
                return  # redelivered
            job.parts.append(JobPart(rank=p.part, cluster=p.cluster, node=p.node, gpu_model=p.gpu_model,
                                     gpu_uuids=list(p.gpu_uuids), gpu_indices=list(p.gpu_indices)))
            job.parts.sort(key=lambda part: part.rank)
            job.gpu_uuids = [u for part in job.parts for u in part.gpu_uuids]
            job.gpu_model = job.parts[0].gpu_model
        else:
            job.gpu_uuids, job.gpu_model = list(p.gpu_uuids), p.gpu_model

    def _report(self, job: JobRecord, r: JobStarted | JobFinished | JobFailed) -> None:
        if not from_attempt_node(job, r):
            return  # the live scheduler ignores it too (progress.py)
        if isinstance(r, (JobFinished, JobFailed)) and late_end(job, r):
            decision = after_end(job, r, self.max_restarts)
            job.held_until = job.lost_attempt = None
            if not decision.requeue:
                record_end(job, r)
        if not isinstance(r, JobStarted):
            self._ended.add((job.job_id, r.attempt))
            if job.state == "pending" and r.attempt == job.attempt:
                job.held_until = None  # the stopped attempt ended: free to be placed again
        if r.attempt != job.attempt or job.state not in ACTIVE:
            return
        if job.parts:
            if isinstance(r, JobFinished) and r.interrupted:
                return  # a planned stop of one part: the requeue that follows moves the whole gang
            step = on_part_report(job, r)
            if step.action == "failed":
                if job.spec.restart_on_failure and len(job.requeues) < self.max_restarts:
                    return  # the requeue that follows says where it went
                failed = next(p for p in job.parts if p.rank == (r.rank or 0))
                job.state, job.reason = "failed", step.reason
                job.exit_code, job.finished_at = failed.exit_code, failed.finished_at
            return
        if isinstance(r, JobStarted):
            job.state, job.started_at = "running", r.started_at
            return
        decision = after_end(job, r, self.max_restarts)
        if decision.requeue:
            where = job.node or "?"
            line = f"attempt {job.attempt} on {where}: {decision.reason}"
            back_to_queue(job, line, decision.reason, decision.cause, None)
        else:
            record_end(job, r)

    def _requeued(self, job: JobRecord, env: Envelope, q: JobRequeued) -> None:
        if q.attempt != job.attempt:
            return
        line = f"attempt {q.attempt} on {', '.join(q.gang_nodes or [q.node])}: {q.reason}"
        if job.state in ("pending", "cancelled"):
            return  # already folded from the attempt's own end (interrupted, restart), or cancelled
        if job.state not in ACTIVE and q.cause != "restart_on_failure":
            return
        if q.estimate_left_s is not None:
            job.estimate_left_s = q.estimate_left_s
        stopped = q.cause in ("preempted", "node_drained", "node_lost") and (job.job_id, q.attempt) not in self._ended
        hold = env.time + timedelta(seconds=self.hold_s) if stopped else None
        back_to_queue(job, line, q.reason, q.cause, hold)


    # ------------------------------------------------------------ snapshots

    def forget_finished(self, before: datetime) -> int:
        """Drop jobs that ended before `before` (a snapshot keeps the live state and recent history, so a
        rebuild's time grows with those, not with every job ever); returns how many were dropped."""
        old = [j.job_id for j in self.jobs.values()
               if j.state in TERMINAL and (j.finished_at or j.submitted_at) < before]
        for job_id in old:
            del self.jobs[job_id]
        self._ended = {(j, a) for j, a in self._ended if j in self.jobs}
        return len(old)

    def dump(self, seq: int) -> bytes:
        """The fold as of stream sequence `seq`, compressed."""
        head = json.dumps({"seq": seq, "ended": sorted(self._ended)}).encode()
        return zlib.compress(head + b"\n" + _RECORDS.dump_json(list(self.jobs.values())), 3)

    @classmethod
    def load(cls, blob: bytes, hold_s: float, max_restarts: int) -> tuple[Fold, int]:
        """A fold from `dump`, and the stream sequence it is as of."""
        head, _, body = zlib.decompress(blob).partition(b"\n")
        meta = json.loads(head)
        f = cls(hold_s, max_restarts)
        f.jobs = {j.job_id: j for j in _RECORDS.validate_json(body)}
        f._ended = {(j, a) for j, a in meta["ended"]}
        return f, int(meta["seq"])


def fold(events: Iterable[tuple[Envelope, EventData]], hold_s: float, max_restarts: int) -> dict[str, JobRecord]:
    """Every job's record from its events in stream order."""
    f = Fold(hold_s, max_restarts)
    for env, data in events:
        f.apply(env, data)
    return f.jobs
