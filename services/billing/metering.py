"""Metering: the usage ledger's records and what they turn into for allocation. Pure, no I/O.

A usage record is one job attempt: its tags (team, project, model, GPUs) and
its allocation interval, from `job.started` (`started_at`) to `job.finished`
(`finished_at`) or `job.failed` (`failed_at`). A job that never started holds
no interval. A record still running has no `ended_at`; a report counts it up
to the report's end. Every write is a pure function of the events, keyed by
(job, attempt), so replays and redeliveries give the same ledger.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel

from .allocation import Interval, JobInfo
from .ownership import to_ms
from .pricing import gpu_seconds


class UsageRecord(BaseModel):
    job_id: str
    attempt: int
    team: str
    project: str
    gpu_model: str
    gpus: int
    node: str
    cluster: str = ""
    gpu_uuids: list[str] = []
    started_at: datetime
    ended_at: datetime | None = None
    state: str = "finished"  # running | finished | failed | requeued
    gpu_seconds: Decimal = Decimal(0)

    @property
    def key(self) -> str:
        return f"{self.job_id}:{self.attempt}"


def ended(record: UsageRecord, end: datetime, state: str) -> UsageRecord:
    """The record of an attempt that ended at `end`."""
    return record.model_copy(update={
        "ended_at": end, "state": state, "gpu_seconds": gpu_seconds(record.started_at, end, record.gpus)})


def intervals(records: list[UsageRecord], now: datetime) -> tuple[list[Interval], dict[str, JobInfo]]:
    """One interval per GPU per attempt; running attempts are held until `now`."""
    out: list[Interval] = []
    jobs: dict[str, JobInfo] = {}
    now_ms = to_ms(now)
    for r in records:
        key = r.key
        jobs[key] = JobInfo(r.job_id, r.attempt, r.team, r.project, r.gpu_model, running=r.ended_at is None)
        start = to_ms(r.started_at)
        end = to_ms(r.ended_at) if r.ended_at is not None else max(now_ms, start)
        for gpu in r.gpu_uuids:
            out.append(Interval(gpu, start, end, key))
    return out, jobs


def energy_delta(last: tuple[int, float] | None, t_ms: int, joules: float) -> tuple[float, bool]:
    """Joules drawn since the last reading of a GPU's energy counter, and whether to keep the new reading.

    The counter counts since boot: a reading older than the last one (a
    redelivery) adds nothing, and a smaller value (driver reload) starts a new
    baseline rather than counting a negative draw.
    """
    if last is None:
        return 0.0, True
    last_ms, last_j = last
    if t_ms <= last_ms:
        return 0.0, False
    if joules < last_j:
        return 0.0, True
    return joules - last_j, True
