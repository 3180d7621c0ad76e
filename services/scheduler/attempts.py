"""Reconcile what a node says it runs with what the scheduler thinks runs there. Pure (no I/O).

Every heartbeat lists the node's attempts: those running under their
supervisors, and those that ended recently with the exit their supervisor
recorded. Both ways:
- an attempt we think active there that the node lists as ended is ended with
  the recorded status (as if its job.finished had arrived; it may still be on
  its way, and ending twice changes nothing);
- one the node does not list at all is lost: its process is gone with no exit
  recorded (the node rebooted), or it never started and the node has confirmed
  it never will (a heartbeat past the placement's start-by, or one that lists it
  as refused: fencing.py);
- one the node runs that is an older attempt of the job, or of a job that has
  ended, is stopped (never one our possibly lagging read does not know yet, and
  never the current attempt on a heartbeat the node sent before that attempt's
  recorded end: the heartbeat was on its way while the attempt exited, nor a
  part of an ended job within `stopping_s` of that end: the end sent it its stop
  order, with a grace period to honour it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from whaleflux.shared.events import AttemptReport, JobFinished, NodeHeartbeat

from .fencing import Unstarted, refused, releases_hold, unstarted
from .records import ACTIVE, TERMINAL, JobRecord

# A started attempt missing from a heartbeat the node sent this much later than its start is lost
# (the node adds an attempt to its list before it reports the start; both times are the node's clock).
STARTED_SLACK_S = 2.0


@dataclass
class Plan:
    ended: list[JobFinished] = field(default_factory=list)
    lost: list[tuple[JobRecord, str]] = field(default_factory=list)
    # Placed attempts given up on before they started: requeued at once when the node confirmed it will not start
    # them, else with a stop order and a hold.
    unstarted: list[tuple[JobRecord, Unstarted]] = field(default_factory=list)
    # Jobs held after a requeue whose held attempt the node lists as refused: placed again at once.
    released: list[JobRecord] = field(default_factory=list)
    stop: list[AttemptReport] = field(default_factory=list)


def _rank_here(job: JobRecord, cluster: str, node: str) -> tuple[bool, int | None]:
    """Whether the current attempt still has a live part on the node, and that part's rank (None: one node)."""
    if not job.parts:
        return job.cluster == cluster and job.node == node, None
    for part in job.parts:
        if part.cluster == cluster and part.node == node:
            return part.state != "exited", part.rank
    return False, None


def _ended_at(job: JobRecord, cluster: str, node: str) -> datetime | None:
    """When the current attempt ended on that node, as its own report said (node clock; None: not ended)."""
    if job.parts:
        part = next((p for p in job.parts if p.cluster == cluster and p.node == node), None)
        return part.finished_at if part is not None and part.state == "exited" else None
    return job.finished_at if job.state not in ACTIVE else None


def reconcile(hb: NodeHeartbeat, sent_at: datetime, ours: list[JobRecord], others: dict[str, JobRecord],
              now: datetime, placement_report_s: float, stopping_s: float = 0.0) -> Plan:
    """What to do about one heartbeat (`sent_at`: its envelope time, the node's clock). `ours`: jobs we think
    active on the node; `others`: the records of the other jobs it lists; `stopping_s`: how long a part that
    was sent a stop order when its job ended has to stop before it is sent another."""
    plan = Plan()
    listed = {(a.job_id, a.attempt, a.rank or 0): a for a in hb.attempts or []}
    for job in ours:
        live, rank = _rank_here(job, hb.cluster, hb.node)
        if job.state not in ACTIVE or not live:
            continue
        report = listed.get((job.job_id, job.attempt, rank or 0))
        if report is not None and report.state == "exited":
            plan.ended.append(JobFinished(
                job_id=job.job_id, attempt=job.attempt, cluster=hb.cluster, node=hb.node,
                exit_code=report.exit_code if report.exit_code is not None else -1,
                started_at=report.started_at or job.started_at or report.finished_at or sent_at,
                finished_at=report.finished_at or sent_at, rank=rank, interrupted=report.interrupted,
            ))
            continue
        if report is not None and report.state == "refused":
            plan.unstarted.append((job, refused(job, hb.node, report.interrupted)))
            continue
        if report is not None:
            continue
        part = next((p for p in job.parts if p.rank == rank), None) if job.parts else None
        started_at = part.started_at if part is not None else job.started_at
        if started_at is not None:
            if (sent_at - started_at).total_seconds() > STARTED_SLACK_S:
                plan.lost.append((job, f"node {hb.node} no longer runs attempt {job.attempt} and recorded no exit"))
        elif (verdict := unstarted(job, hb.node, sent_at, now, placement_report_s)) is not None:
            plan.unstarted.append((job, verdict))
    mine = {j.job_id: j for j in ours}
    for a in hb.attempts or []:
        if a.state == "refused" and (held := others.get(a.job_id)) is not None:
            if releases_hold(held, a, hb.cluster, hb.node):
                plan.released.append(held)
        if a.state != "running":
            continue
        record = mine.get(a.job_id) or others.get(a.job_id)
        if record is None:
            continue  # not ours to judge (another deployment's, or older than the history kept)
        if a.attempt > record.attempt:
            continue  # newer than what we read: our view lags, never the node's
        live, rank = _rank_here(record, hb.cluster, hb.node)
        here = record.state in ACTIVE and live and (rank or 0) == (a.rank or 0)
        if a.attempt == record.attempt and (record.state == "pending" or here):
            continue  # the current attempt where it belongs, or one being stopped already (the job is queued again)
        if a.attempt == record.attempt:
            ended = _ended_at(record, hb.cluster, hb.node)
            if ended is not None and (sent_at - ended).total_seconds() < STARTED_SLACK_S:
                continue  # a heartbeat from before (or just at) the end we have: it ran then, it has exited since
            if (record.state in TERMINAL and live and record.finished_at is not None
                    and (now - record.finished_at).total_seconds() < stopping_s):
                continue  # told to stop when the job ended (a gang's other part failed, a cancel): it is stopping
        plan.stop.append(a)
    return plan
