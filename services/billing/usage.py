"""The usage ledger as columns: what a report reads of every record in its window. Pure, no I/O.

Beside each usage record (JSON, every field) the store keeps its report row
(`row`): a JSON array of the fields a chargeback needs, times as epoch ms,
`[job_id, attempt, rank, team, project, gpu_model, start_ms, end_ms or null,
GPU uuids, node, cluster]`, the GPU uuids as the JSON text of their list. A
report decodes its window's rows with one `json.loads` into columns
(`UsageColumns.decode`): no model validated and no datetime made per record,
each distinct GPU list decoded once (a fleet has far fewer of them, a node's
GPUs and a few of them, than a report has records), and no container kept per
record for the cyclic collector to walk. The ledger holds trusted data (the events were
validated at ingest and the rows are written by `row` alone); a million
intervals parsed record by record took longer than pricing them.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from itertools import compress
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from .allocation import Attempts, JobInfo
from .metering import UsageRecord
from .ownership import to_ms

__all__ = ["UsageColumns", "no_gc", "row"]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


# json.dumps(..., separators=(",", ":")) without a new encoder per call (written once per record at ingest).
_compact = json.JSONEncoder(separators=(",", ":")).encode


def row(record: UsageRecord) -> str:
    """The record's report row, as the store keeps it (`usage:rows`)."""
    return _compact([record.job_id, record.attempt, record.rank, record.team, record.project, record.gpu_model,
                    to_ms(record.started_at), None if record.ended_at is None else to_ms(record.ended_at),
                    _gpu_list(record), record.node, record.cluster])


def _gpu_list(record: UsageRecord) -> str:
    return _compact(record.gpu_uuids)


@dataclass(frozen=True, eq=False)
class UsageColumns:
    """One entry per ledger record (a gang part is a record), in the order read: its attempt, tags, GPUs, and
    allocation [start, end) in epoch ms (`to_ms`); a running record has `running` set and `end` = `start`."""

    job_id: list[str]
    attempt: list[int]
    rank: list[int]
    team: list[str]
    project: list[str]
    model: list[str]
    start: I64
    end: I64
    running: Bools
    gpu_list: list[str]  # each record's GPU uuids, the JSON text of the list (`gpu_lists` decodes them)
    node: list[str]
    cluster: list[str]

    @classmethod
    def of(cls, records: Sequence[UsageRecord]) -> UsageColumns:
        """The records' columns (tests, and what a store without rows holds)."""
        with no_gc():
            get: Callable[[str], list[Any]] = lambda name: list(map(attrgetter(name), records))  # noqa: E731
            ended = get("ended_at")
            running = np.fromiter((e is None for e in ended), np.bool_, len(records))
            start = _ms(get("started_at"), len(records))
            end = start.copy()
            end[~running] = _ms([e for e in ended if e is not None], int((~running).sum()))
            return cls(get("job_id"), get("attempt"), get("rank"), get("team"), get("project"), get("gpu_model"),
                       start, end, running, list(map(_gpu_list, records)), get("node"), get("cluster"))

    @classmethod
    def decode(cls, rows: Iterable[str]) -> UsageColumns:
        """The columns of report rows (`row`), all decoded at once."""
        return cls.decode_joined(",".join(rows))

    @classmethod
    def decode_joined(cls, rows: str) -> UsageColumns:
        """The columns of report rows joined by commas (what the store's window script returns)."""
        with no_gc():
            parsed = json.loads("[" + rows + "]")
            if not parsed:
                return cls.of([])
            columns = list(map(list, zip(*parsed, strict=True)))
            del parsed  # before the collector runs again: it would walk every row's list once more
            job_id, attempt, rank, team, project, model, start, end, gpus, node, cluster = columns
            running = np.fromiter((e is None for e in end), np.bool_, len(end))
            if running.any():
                end = [s if e is None else e for s, e in zip(start, end, strict=True)]
            return cls(job_id, attempt, rank, team, project, model, np.array(start, dtype=np.int64),
                       np.array(end, dtype=np.int64), running, gpus, node, cluster)

    def __len__(self) -> int:
        return len(self.job_id)

    def overlapping(self, start_ms: int, end_ms: int) -> UsageColumns:
        """The records whose allocation overlaps [start_ms, end_ms) (running ones: any that start before end)."""
        keep = (self.start < end_ms) & (self.running | (self.end > start_ms))
        if keep.all():
            return self
        picked = keep.tolist()

        def pick(values: list[Any]) -> list[Any]:
            return list(compress(values, picked))

        return UsageColumns(pick(self.job_id), pick(self.attempt), pick(self.rank), pick(self.team),
                            pick(self.project), pick(self.model), self.start[keep], self.end[keep],
                            self.running[keep], pick(self.gpu_list), pick(self.node), pick(self.cluster))

    @cached_property
    def keys(self) -> list[str]:
        """Each record's attempt key (`UsageRecord.key`; every part of a gang shares it)."""
        return [f"{j}:{a}" for j, a in zip(self.job_id, self.attempt, strict=True)]

    @cached_property
    def gpu_lists(self) -> tuple[list[list[str]], I64]:
        """The distinct GPU lists in order of first appearance, and each record's among them."""
        index: dict[str, int] = dict.fromkeys(self.gpu_list, 0)
        distinct = list(index)
        for i, k in enumerate(distinct):
            index[k] = i
        which = np.fromiter(map(index.__getitem__, self.gpu_list), np.int64, len(self))
        return [json.loads(d) for d in distinct], which

    def first_holders(self) -> Iterator[tuple[str, int]]:
        """Each GPU any record holds, in order of first appearance, with the first record holding it."""
        distinct, which = self.gpu_lists
        first = np.unique(which, return_index=True)[1].tolist()  # codes are in order of appearance
        seen: set[str] = set()
        for gpus, i in zip(distinct, first, strict=True):
            for g in gpus:
                if g not in seen:
                    seen.add(g)
                    yield g, i

    @cached_property
    def jobs(self) -> Attempts:
        """The attempts the records charge (`metering.job_infos`): a gang's parts share rank 0's tags, running
        while any part is. Each record its own attempt (no gang): the records' own columns, no copy."""
        running = self.running.tolist()
        if not any(self.rank) and len(set(self.keys)) == len(self):
            return Attempts(self.keys, self.job_id, self.attempt, self.team, self.project, self.model, running)
        infos: dict[str, JobInfo] = {}
        min_rank: dict[str, int] = {}
        for key, info, rank in zip(self.keys, map(JobInfo, self.job_id, self.attempt, self.team, self.project,
                                                  self.model, running), self.rank, strict=True):
            prev = infos.get(key)
            if prev is not None:  # another part of the same attempt
                keep = info if rank < min_rank[key] else prev
                info = JobInfo(keep.job_id, keep.attempt, keep.team, keep.project, keep.model,
                               prev.running or info.running)
            min_rank[key] = min(rank, min_rank.get(key, rank))
            infos[key] = info
        return Attempts.of(infos)


def _ms(times: list[datetime], n: int) -> I64:
    """`ownership.to_ms` of each time, without a Python call per time: the float timestamp (microseconds exact
    below 2**53, until the year 2255) back to integer microseconds, floored to the ms."""
    seconds = np.fromiter(map(datetime.timestamp, times), np.float64, n)
    return np.rint(seconds * 1e6).astype(np.int64) // 1000


@contextmanager
def no_gc() -> Iterator[None]:
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
