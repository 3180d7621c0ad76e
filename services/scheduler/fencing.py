"""When an attempt whose node may not have started it can be placed again. Pure (no I/O, no clock).

Every placement carries a fencing token, its `start_by` (job.placed): the
node never starts the attempt later than that by its own clock
(services/agent/fencing.py). So an attempt a node never reported is given up
on only when the node has confirmed it will not start it: a heartbeat sent
after `start_by` (the node's clock, the one its check reads) that does not
list it, or one that lists it as refused. An attempt placed without a token
(by an older scheduler) may start whenever its placement reaches the node: it
is requeued after `placement_report_s` with a stop order behind the placement
and a hold. A node declared lost holds its jobs `hold_s` (its supervisors'
self-fence and grace, the longer of the scheduler's and what the node
announced in its registration), counted from `start_by` for an attempt that may not
have started yet, unless the node lists it as refused when it is heard again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from whaleflux.shared.events import AttemptReport, NodeRegistered

from .records import JobRecord


@dataclass(frozen=True)
class Unstarted:
    """A placed attempt given up on: why, and whether the node confirmed it will never start it (else it is
    requeued with a stop order and a hold)."""

    why: str
    confirmed: bool


def unstarted(job: JobRecord, node: str, sent_at: datetime, now: datetime, window_s: float) -> Unstarted | None:
    """Whether an attempt a heartbeat does not list is given up on (`sent_at`: when the node sent it, its clock;
    `now`: ours); None: the node may still start it."""
    if job.start_by is not None:
        if sent_at <= job.start_by:
            return None
        return Unstarted(f"node {node} never started attempt {job.attempt} and will not: its heartbeat of"
                         f" {sent_at.isoformat()} is past the attempt's start-by {job.start_by.isoformat()}", True)
    if job.placed_at is not None and (now - job.placed_at).total_seconds() > window_s:
        return Unstarted(f"node {node} never started attempt {job.attempt} ({window_s:g} s after placement)", False)
    return None


def refused(job: JobRecord, node: str, reason: str | None) -> Unstarted:
    """The node listed the attempt as refused: it never started it, and never will."""
    return Unstarted(f"node {node} refused attempt {job.attempt}: {reason or 'its start-by had passed'}", True)


def releases_hold(job: JobRecord, report: AttemptReport, cluster: str, node: str) -> bool:
    """Whether a refusal the node lists ends the hold of a job requeued while the attempt was placed there: the
    node confirmed it never started it (one node's attempt only: a gang's other parts may still run)."""
    return (report.state == "refused" and report.rank is None and job.state == "pending"
            and job.held_until is not None and job.attempt == report.attempt
            and job.cluster == cluster and job.node == node)


def may_start_later(job: JobRecord) -> bool:
    """Whether some part of the current attempt has not reported its start (its node may start it still)."""
    if job.parts:
        return any(p.started_at is None for p in job.parts)
    return job.started_at is None


def node_hold_s(hold_s: float, heartbeat_lost_s: float, reg: NodeRegistered | None) -> float:
    """How long a lost node's jobs are held: the scheduler's `hold_s`, or longer if the node announced a longer
    self-fence budget and grace than the scheduler's settings assume (a budget set on the agents only)."""
    if reg is None or reg.fence_after_s is None:
        return hold_s
    return max(hold_s, (reg.stop_grace_s or 0.0) + max(heartbeat_lost_s, reg.fence_after_s))


def lost_hold(job: JobRecord, now: datetime, hold_s: float) -> datetime:
    """Until when a job of a node declared lost at `now` waits before it is placed again: `hold_s` from now (a
    started attempt's supervisor stops it within that), or from its start_by if it may not have started yet."""
    held = now + timedelta(seconds=hold_s)
    if job.start_by is None or not may_start_later(job):
        return held
    return max(held, job.start_by + timedelta(seconds=hold_s))
