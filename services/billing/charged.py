"""The charged intervals of a report as columns, straight from the ledger records. Pure, no I/O.

`metering.intervals` + `without_overlaps` make one object per GPU per attempt;
a million-interval report spent more time making and sorting those objects
than pricing them. Here the records become `IntervalTable` columns directly
(one pass over the records, the GPUs as codes), and the overlap cut is array
work: sort by (GPU, start, end, attempt), each interval starts no earlier than
the latest end before it on its GPU, and one that ends by then is dropped. The
result is the same intervals in the same order as the object path (so every
sum is taken in the same order: identical amounts, identical floats); only
GPUs with an overlap go through `metering`'s per-interval loop, to describe
each overlap.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from itertools import chain, compress, repeat
from operator import attrgetter, is_

import numpy as np

from .allocation import Interval, IntervalTable, JobInfo
from .allocation.chargeback import I64, codes
from .metering import Overlap, UsageRecord, cut, intervals, job_infos, without_overlaps
from .ownership import from_ms

__all__ = ["charged_table", "record_table", "without_overlaps_table"]
SMALL = 200  # records: below this a one-day report's handful of records costs less as objects


@dataclass(frozen=True)
class _Fields:
    """The records' fields a report needs, as one tuple per field (each record read once, in order)."""

    job_id: tuple[str, ...]
    attempt: tuple[int, ...]
    team: tuple[str, ...]
    project: tuple[str, ...]
    model: tuple[str, ...]
    rank: tuple[int, ...]
    started: tuple[datetime, ...]
    ended: tuple[datetime | None, ...]
    gpus: tuple[list[str], ...]

    @classmethod
    def of(cls, records: list[UsageRecord]) -> _Fields:
        # One list per field: no new object per record for the cyclic collector to walk.
        return cls(*(tuple(map(get, records)) for get in _FIELDS))

    @cached_property
    def keys(self) -> list[str]:
        """Each record's attempt key (`UsageRecord.key`)."""
        return list(map("{}:{}".format, self.job_id, self.attempt))

    @cached_property
    def running(self) -> list[bool]:
        return list(map(is_, self.ended, repeat(None)))


_FIELDS = tuple(map(attrgetter, ("job_id", "attempt", "team", "project", "gpu_model", "rank", "started_at", "ended_at",
                                 "gpu_uuids")))


def _ms(times: Iterable[datetime], n: int) -> I64:
    """`ownership.to_ms` of each time, without a Python call per time: the float timestamp (microseconds exact
    below 2**53, until the year 2255) back to integer microseconds, floored to the ms."""
    seconds = np.fromiter(map(datetime.timestamp, times), np.float64, n)
    return np.rint(seconds * 1e6).astype(np.int64) // 1000


def _table(f: _Fields, now_ms: int) -> IntervalTable:
    n = np.fromiter(map(len, f.gpus), np.int64, len(f.gpus))
    starts = _ms(f.started, len(n))
    running = np.array(f.running, dtype=np.bool_)
    ends = np.full(len(n), now_ms, dtype=np.int64)
    ends[~running] = _ms(filter(None, f.ended), int((~running).sum()))
    ends[running] = np.maximum(ends[running], starts[running])
    gpus, gpu = _gpu_codes(f.gpus)
    jobs, job = codes(list(compress(f.keys, n.tolist())))  # the attempts that held a GPU
    held = n > 0
    return IntervalTable(gpus, jobs, gpu, np.repeat(starts[held], n[held]), np.repeat(ends[held], n[held]),
                         np.repeat(job, n[held]))


def _gpu_codes(lists: tuple[list[str], ...]) -> tuple[list[str], I64]:
    """`codes` of every GPU of every record's list, in order, hashing each distinct list once: a fleet has far
    fewer distinct GPU lists (a node's GPUs, a few of them) than a report has records."""
    keys = list(map(tuple, lists))
    index = dict.fromkeys(keys)
    distinct = list(index)
    for i, k in enumerate(distinct):
        index[k] = i
    which = np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))
    gpus, flat = codes(list(chain.from_iterable(distinct)))  # first appearance in the lists' = in the records'
    lengths = np.fromiter(map(len, distinct), np.int64, len(distinct))
    offsets = np.cumsum(lengths) - lengths
    n = lengths[which]
    within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return gpus, flat[np.repeat(offsets[which], n) + within]


def record_table(records: list[UsageRecord], now_ms: int) -> IntervalTable:
    """`metering.intervals(records, now)` as columns: one row per GPU per record, in the same order."""
    return _table(_Fields.of(records), now_ms)


def _job_infos(f: _Fields, records: list[UsageRecord]) -> dict[str, JobInfo]:
    """`metering.job_infos`, from the fields when no record is a gang part and none came twice."""
    if not any(f.rank):
        jobs = dict(zip(f.keys, map(JobInfo, f.job_id, f.attempt, f.team, f.project, f.model, f.running),
                        strict=True))
        if len(jobs) == len(records):
            return jobs
    return job_infos(records)


def _first_seen(values: I64) -> tuple[I64, I64]:
    """The distinct values in order of first appearance, and each value's index among them."""
    uniq, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq))
    return uniq[order], rank[inverse.reshape(-1)]


def _order(tab: IntervalTable) -> I64:
    """Rows sorted by GPU code, then start, end and attempt key (as strings, like `metering._ORDER`)."""
    if len(tab) and (lo := int(tab.start.min())) >= 0:  # one key per row, (GPU, start), when it fits in int64
        width = int(tab.start.max()) - lo + 1
        if (int(tab.gpu.max()) + 1) * width < 2**62:
            key = tab.gpu * width + (tab.start - lo)
            order = np.argsort(key, kind="stable")
            if not (key[order][1:] == key[order][:-1]).any():  # no GPU with two starts at once: that is the order
                return order
    order = np.lexsort((tab.job, tab.end, tab.start, tab.gpu))
    g, s, e, j = tab.gpu[order], tab.start[order], tab.end[order], tab.job[order]
    tie = (g[1:] == g[:-1]) & (s[1:] == s[:-1]) & (e[1:] == e[:-1]) & (j[1:] != j[:-1])
    if tie.any():  # two attempts with the same interval on one GPU: ordered by key, as the object path does
        by_name = sorted(range(len(tab.jobs)), key=tab.jobs.__getitem__)
        rank = np.empty(len(tab.jobs), dtype=np.int64)
        rank[np.asarray(by_name, dtype=np.int64)] = np.arange(len(tab.jobs))
        order = np.lexsort((rank[tab.job], tab.end, tab.start, tab.gpu))
    return order


def _latest_end_before(gpu: I64, end: I64) -> I64:
    """Per sorted row: the latest end of the rows before it on its GPU (the minimum int64 for a GPU's first)."""
    out = np.full(len(end), np.iinfo(np.int64).min, dtype=np.int64)
    if len(end) < 2:
        return out
    lo, hi = int(end.min()), int(end.max())
    width = hi - lo + 1
    if (int(gpu.max()) + 1) * width < 2**62:  # one running maximum over all GPUs, each GPU offset above the last
        run = np.maximum.accumulate(gpu * width + (end - lo)) - gpu * width + lo
        out[1:] = run[:-1]
    else:
        edges = np.flatnonzero(np.diff(gpu)) + 1
        for a, b in zip([0, *edges.tolist()], [*edges.tolist(), len(end)], strict=True):
            out[a + 1:b] = np.maximum.accumulate(end[a:b])[:-1]
    first = np.ones(len(gpu), dtype=np.bool_)
    first[1:] = gpu[1:] != gpu[:-1]
    out[first] = np.iinfo(np.int64).min
    return out


def without_overlaps_table(tab: IntervalTable) -> tuple[IntervalTable, list[Overlap]]:
    """`metering.without_overlaps` on columns: every GPU's time held once, and the overlaps found."""
    if len(tab) == 0:
        return tab, []
    order = _order(tab)
    gpu, start, end, job = tab.gpu[order], tab.start[order], tab.end[order], tab.job[order]
    before = _latest_end_before(gpu, end)
    alone = np.bincount(gpu, minlength=len(tab.gpus))[gpu] == 1
    new_start = np.maximum(start, before)
    keep = alone | (end > new_start)
    overlapped = np.unique(gpu[start < before])
    overlaps: list[Overlap] = []
    for code in overlapped.tolist():  # rare: described by the object path, GPU by GPU in order
        rows = np.flatnonzero(gpu == code)
        name = tab.gpus[code]
        overlaps.extend(cut(name, [Interval(name, s, e, tab.jobs[j]) for s, e, j in zip(
            start[rows].tolist(), end[rows].tolist(), job[rows].tolist(), strict=True)])[1])
    gpu, new_start, end, job = gpu[keep], new_start[keep], end[keep], job[keep]
    gpu_codes, gpu = _first_seen(gpu)
    job_codes, job = _first_seen(job)
    return IntervalTable([tab.gpus[c] for c in gpu_codes.tolist()], [tab.jobs[c] for c in job_codes.tolist()],
                         gpu, new_start, end, job), overlaps


def charged_table(records: list[UsageRecord], now_ms: int, small: int = SMALL
                  ) -> tuple[IntervalTable, dict[str, JobInfo], list[Overlap]]:
    """The records' intervals with every GPU's time charged once (columns), the attempts, the overlaps cut.
    Fewer than `small` records go the object path (the same result; cheaper than the array calls there)."""
    if len(records) < small:
        ivs, jobs = intervals(records, from_ms(now_ms))
        kept, overlaps = without_overlaps(ivs)
        return IntervalTable.of(kept), jobs, overlaps
    with _no_gc():
        f = _Fields.of(records)
        tab, overlaps = without_overlaps_table(_table(f, now_ms))
        return tab, _job_infos(f, records), overlaps


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector paused while a report makes its hundreds of thousands of objects at once (no
    cycles among them): each collection would walk every record of the window again, which took 4/5 of the
    time. Plain code, no await inside: nothing else runs meanwhile on the event loop."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
