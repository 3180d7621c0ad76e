"""Metering: the usage ledger's records and what they turn into for allocation. Pure, no I/O.

A usage record is one job attempt: its tags (team, project, model, GPUs) and
its allocation interval, from `job.started` (`started_at`) to `job.finished`
(`finished_at`) or `job.failed` (`failed_at`). A job that never started holds
no interval. A record still running has no `ended_at`; a report counts it up
to the report's end. Every write is a pure function of the events, keyed by
(job, attempt), so replays and redeliveries give the same ledger.

A gang spanning nodes reports each node's part (its `rank`) on its own: the
ledger holds one record per part, each with that node's GPUs and interval, so
every GPU of the gang is charged once, for the time its part ran. Costs are
still per attempt: every part's intervals carry the attempt's key, and
`merge_parts` folds the parts into one line for a job's view. What each job
event changes in the ledger is decided in ledger.py.
"""

from __future__ import annotations

from dataclasses import replace
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
    # Which part of a gang spanning nodes (0: rank 0, or a job on one node); `nodes`: a merged record's.
    rank: int = 0
    nodes: list[str] = []

    @property
    def key(self) -> str:
        """The attempt this usage is charged to (all parts of a gang share it)."""
        return f"{self.job_id}:{self.attempt}"

    @property
    def ledger_key(self) -> str:
        """Where the record is kept: one per part (rank 0 and a one-node job keep the attempt's key)."""
        return ledger_key(self.job_id, self.attempt, self.rank)


def ledger_key(job_id: str, attempt: int, rank: int = 0) -> str:
    return f"{job_id}:{attempt}" + (f"#r{rank}" if rank else "")


def merge_parts(records: list[UsageRecord]) -> list[UsageRecord]:
    """One record per attempt: a gang's parts folded together (GPUs and GPU-seconds summed,
    earliest start, latest end once every part ended), sorted by attempt."""
    by_attempt: dict[str, list[UsageRecord]] = {}
    for r in records:
        by_attempt.setdefault(r.key, []).append(r)
    out = []
    for parts in by_attempt.values():
        parts.sort(key=lambda r: r.rank)
        first = parts[0]
        if len(parts) == 1:
            out.append(first)
            continue
        ends = [p.ended_at for p in parts if p.ended_at is not None]
        open_ = len(ends) < len(parts)
        states = {p.state for p in parts}
        out.append(first.model_copy(update={
            "gpus": sum(p.gpus for p in parts),
            "gpu_uuids": [g for p in parts for g in p.gpu_uuids],
            "started_at": min(p.started_at for p in parts),
            "ended_at": None if open_ else max(ends),
            "state": "running" if open_ else next((s for s in ("failed", "requeued") if s in states), "finished"),
            "gpu_seconds": sum((p.gpu_seconds for p in parts), Decimal(0)),
            "nodes": [p.node for p in parts],
        }))
    return sorted(out, key=lambda r: (r.attempt, r.job_id))


def ended(record: UsageRecord, end: datetime, state: str) -> UsageRecord:
    """The record of an attempt that ended at `end`."""
    return record.model_copy(update={
        "ended_at": end, "state": state, "gpu_seconds": gpu_seconds(record.started_at, end, record.gpus)})


def intervals(records: list[UsageRecord], now: datetime) -> tuple[list[Interval], dict[str, JobInfo]]:
    """One interval per GPU per attempt; running attempts are held until `now`."""
    out: list[Interval] = []
    jobs: dict[str, JobInfo] = {}
    min_rank: dict[str, int] = {}
    now_ms = to_ms(now)
    for r in records:
        key = r.key
        info = JobInfo(r.job_id, r.attempt, r.team, r.project, r.gpu_model, running=r.ended_at is None)
        prev = jobs.get(key)
        if prev is not None:  # another part of the same gang attempt: rank 0's tags, running while any part is
            info = replace(info if r.rank < min_rank[key] else prev, running=prev.running or info.running)
        min_rank[key] = min(r.rank, min_rank.get(key, r.rank))
        jobs[key] = info
        start = to_ms(r.started_at)
        end = to_ms(r.ended_at) if r.ended_at is not None else max(now_ms, start)
        for gpu in r.gpu_uuids:
            out.append(Interval(gpu, start, end, key))
    return out, jobs
