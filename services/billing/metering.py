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

Two allocations of one GPU that overlap in time (a lost end event, a
scheduler fault) are charged once: `without_overlaps` gives the time to the
one that started first and reports every overlap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from operator import attrgetter

from pydantic import BaseModel, Field

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
    gpu_uuids: list[str] = Field(default_factory=list)  # a factory: a `[]` default is deep-copied per record
    started_at: datetime
    ended_at: datetime | None = None
    state: str = "finished"  # running | finished | failed | requeued
    gpu_seconds: Decimal = Decimal(0)
    # Which part of a gang spanning nodes (0: rank 0, or a job on one node); `nodes`: a merged record's.
    rank: int = 0
    nodes: list[str] = Field(default_factory=list)

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
    """One interval per GPU per attempt; running attempts are held until `now` (charged.py: as columns)."""
    out: list[Interval] = []
    now_ms = to_ms(now)
    for r in records:
        key = r.key
        start = to_ms(r.started_at)
        end = to_ms(r.ended_at) if r.ended_at is not None else max(now_ms, start)
        for gpu in r.gpu_uuids:
            out.append(Interval(gpu, start, end, key))
    return out, job_infos(records)


def job_infos(records: list[UsageRecord]) -> dict[str, JobInfo]:
    """The attempts the records charge: a gang's parts share rank 0's tags, running while any part is."""
    jobs: dict[str, JobInfo] = {}
    min_rank: dict[str, int] = {}
    for r in records:
        key = r.key
        info = JobInfo(r.job_id, r.attempt, r.team, r.project, r.gpu_model, running=r.ended_at is None)
        prev = jobs.get(key)
        if prev is not None:  # another part of the same gang attempt: rank 0's tags, running while any part is
            info = replace(info if r.rank < min_rank[key] else prev, running=prev.running or info.running)
        min_rank[key] = min(r.rank, min_rank.get(key, r.rank))
        jobs[key] = info
    return jobs


@dataclass(frozen=True)
class Overlap:
    """One GPU held by two attempts at once over [start_ms, end_ms): charged to `kept` (it started first)."""

    gpu: str
    kept: str
    dropped: str
    start_ms: int
    end_ms: int


_ORDER = attrgetter("start_ms", "end_ms", "job")  # deterministic: the same intervals in any order, the same cut


def without_overlaps(ivs: list[Interval]) -> tuple[list[Interval], list[Overlap]]:
    """The intervals with every GPU's time held once (a later-starting interval loses the time an earlier
    one already holds), and the overlaps found (between different attempts)."""
    by_gpu: dict[str, list[Interval]] = defaultdict(list)
    for iv in ivs:
        by_gpu[iv.gpu].append(iv)
    out: list[Interval] = []
    overlaps: list[Overlap] = []
    for gpu, items in by_gpu.items():
        if len(items) == 1:
            out.extend(items)
            continue
        kept, found = cut(gpu, items)
        out.extend(kept)
        overlaps.extend(found)
    return out, overlaps


def cut(gpu: str, items: list[Interval]) -> tuple[list[Interval], list[Overlap]]:
    """One GPU's intervals (two or more) with its time held once, in order, and the overlaps found."""
    items = sorted(items, key=_ORDER)
    kept: list[Interval] = []  # this GPU's charged time, in order, never overlapping
    overlaps: list[Overlap] = []
    for iv in items:
        until = kept[-1].end_ms if kept else iv.start_ms
        if iv.start_ms < until:
            overlaps.extend(_overlaps_with(kept, iv))
        start = max(iv.start_ms, until)
        if iv.end_ms > start:
            kept.append(iv if start == iv.start_ms else Interval(gpu, start, iv.end_ms, iv.job))
    return kept, overlaps


def _overlaps_with(kept: list[Interval], iv: Interval) -> list[Overlap]:
    """The overlaps of `iv` with the charged time before it (each with the attempt charged for that time)."""
    found = []
    for k in reversed(kept):
        if k.end_ms <= iv.start_ms:
            break
        lo, hi = max(k.start_ms, iv.start_ms), min(k.end_ms, iv.end_ms)
        if lo < hi and k.job != iv.job:
            found.append(Overlap(iv.gpu, k.job, iv.job, lo, hi))
    return found[::-1]
