"""The charged intervals of a report as columns, straight from the ledger's columns. Pure, no I/O.

`metering.intervals` + `without_overlaps` make one object per GPU per attempt;
a million-interval report spent more time making and sorting those objects
than pricing them. Here the ledger's columns (`usage.UsageColumns`) become
`IntervalTable` columns directly (the GPUs as codes), and the overlap cut is
array work: sort by (GPU, start, end, attempt), each interval starts no
earlier than the latest end before it on its GPU, and one that ends by then is
dropped. The result is the same intervals in the same order as the object path
(so every sum is taken in the same order: identical amounts, identical
floats); only GPUs with an overlap go through `metering`'s per-interval loop,
to describe each overlap. The attempts stay the ledger's columns too
(`allocation.Attempts`), read in the table's order through each attempt's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, compress
from typing import NamedTuple

import numpy as np

from .allocation import Interval, IntervalTable, JobInfo
from .allocation.columns import I64, codes
from .metering import Overlap, cut, without_overlaps
from .usage import UsageColumns, no_gc

__all__ = ["Charged", "charged_table", "record_table", "without_overlaps_table"]
SMALL = 200  # records: below this a one-day report's handful of records costs less as objects


class Charged(NamedTuple):
    """A report's intervals with every GPU's time charged once, the attempts they charge, the overlaps cut."""

    table: IntervalTable
    jobs: Mapping[str, JobInfo]  # the records' attempts (`UsageColumns.jobs`: columns)
    overlaps: list[Overlap]


def _ends(u: UsageColumns, now_ms: int) -> I64:
    """Each record's end; a running one is held until `now_ms` (never before its start)."""
    return np.where(u.running, np.maximum(now_ms, u.start), u.end)


def record_table(u: UsageColumns, now_ms: int) -> IntervalTable:
    """`metering.intervals(records, now)` as columns: one row per GPU per record, in the same order."""
    distinct, which = u.gpu_lists
    n = np.fromiter(map(len, distinct), np.int64, len(distinct))[which]
    gpus, gpu = _gpu_codes(u)
    held = n > 0
    if len(u.jobs) == len(u) and held.all():  # each record its own attempt, each holding a GPU: coded in order
        jobs, job = u.keys, np.arange(len(u), dtype=np.int64)
    else:
        jobs, job = codes(list(compress(u.keys, n.tolist())))  # the attempts that held a GPU
    return IntervalTable(gpus, jobs, gpu, np.repeat(u.start[held], n[held]),
                         np.repeat(_ends(u, now_ms)[held], n[held]), np.repeat(job, n[held]))


def _gpu_codes(u: UsageColumns) -> tuple[list[str], I64]:
    """`codes` of every GPU of every record's list, in order, each distinct list's GPUs coded once."""
    distinct, which = u.gpu_lists
    gpus, flat = codes(list(chain.from_iterable(distinct)))  # first appearance in the lists' = in the records'
    lengths = np.fromiter(map(len, distinct), np.int64, len(distinct))
    offsets = np.cumsum(lengths) - lengths
    n = lengths[which]
    within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return gpus, flat[np.repeat(offsets[which], n) + within]


def _first_seen(values: I64, n: int) -> tuple[I64, I64]:
    """The distinct values (codes below `n`) in order of first appearance, and each value's index among them:
    each code's first row by one unbuffered minimum, then a sort of the distinct codes only."""
    first = np.full(n, len(values), dtype=np.int64)
    np.minimum.at(first, values, np.arange(len(values), dtype=np.int64))
    present = np.flatnonzero(first < len(values))
    order = present[np.argsort(first[present], kind="stable")]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return order, rank[values]


def _order(tab: IntervalTable) -> I64:
    """Rows sorted by GPU code, then start, end and attempt key (as strings, like `metering._ORDER`)."""
    if len(tab) and (lo := int(tab.start.min())) >= 0:  # one key per row, (GPU, start), when it fits in int64
        width = int(tab.start.max()) - lo + 1
        if (int(tab.gpu.max()) + 1) * width < 2**62:
            key = tab.gpu * width + (tab.start - lo)
            order = np.argsort(key)  # not stable (4x faster): the same order when every key is distinct
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
    out, overlaps, _ = _cut(tab)
    return out, overlaps


def _cut(tab: IntervalTable) -> tuple[IntervalTable, list[Overlap], I64]:
    """`without_overlaps_table`, and each attempt's code in `tab` (`out.jobs[i]` is `tab.jobs[codes[i]]`)."""
    if len(tab) == 0:
        return tab, [], np.arange(len(tab.jobs), dtype=np.int64)
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
    gpu_codes, gpu = _first_seen(gpu, len(tab.gpus))
    job_codes, job = _first_seen(job, len(tab.jobs))
    return IntervalTable(list(map(tab.gpus.__getitem__, gpu_codes.tolist())),
                         list(map(tab.jobs.__getitem__, job_codes.tolist())), gpu, new_start, end, job), overlaps, \
        job_codes


def charged_table(u: UsageColumns, now_ms: int, small: int = SMALL) -> Charged:
    """The records' intervals with every GPU's time charged once (columns), the attempts, the overlaps cut.
    Fewer than `small` records go the object path (the same result; cheaper than the array calls there)."""
    if len(u) < small:
        distinct, which = u.gpu_lists
        ivs = [Interval(g, s, e, key) for key, s, e, w in zip(u.keys, u.start.tolist(), _ends(u, now_ms).tolist(),
                                                                 which.tolist(), strict=True) for g in distinct[w]]
        kept, overlaps = without_overlaps(ivs)
        return Charged(IntervalTable.of(kept), u.jobs, overlaps)
    with no_gc():
        records = record_table(u, now_ms)
        tab, overlaps, job_codes = _cut(records)
        jobs = u.jobs
        if records.jobs is jobs.names and len(tab.jobs) == len(jobs):  # coded by record, none cut out whole:
            jobs = jobs.view(tab.jobs, job_codes)  # the same attempts in the table's order, no lookup per attempt
        return Charged(tab, jobs, overlaps)
