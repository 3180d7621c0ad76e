"""Chargeback over a window: each job attempt's cost and each pool's fleet, allocated and idle cost. Pure, no I/O.

Exact amounts, kept to 1e-6 USD (the rounding rule in `allocation/__init__.py`).

The intervals are columns (`IntervalTable`: GPU and attempt codes, start and end
ms as numpy arrays), so a million of them cost a few array passes: each
interval's rate segments are found by one binary search over every GPU's
segments at once, GPU-ms are summed per (attempt, segment), and each sum is
priced in integer micro-dollars. Pricing is exact: the float product decides
the rounding only where it is provably far from a half micro-dollar, and the
few sums near one are priced in Decimal as before (`_price_micro`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from functools import cached_property
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from ..ownership import GpuCost
from ..pricing import MICRO
from .attempts import Attempts, JobInfo
from .columns import I64, codes, sum_by

J_PER_KWH = Decimal(3_600_000)
MS_PER_HOUR = 3_600_000
# The float product of a GPU-ms sum and its rate is within 4.4e-4 micro-dollars of the exact one below 2**40
# micro-dollars (a relative error of at most 4 x 2**-53); outside NEAR_HALF of a half micro-dollar, rounding
# the float gives the exact rounding.
NEAR_HALF = 1e-3
FLOAT_EXACT_BELOW = float(2**40)


@dataclass(frozen=True, slots=True)
class Interval:
    """One GPU held by one job attempt, [start_ms, end_ms)."""

    gpu: str
    start_ms: int
    end_ms: int
    job: str  # "<job_id>:<attempt>"


@dataclass(frozen=True)
class IntervalTable:
    """Intervals as columns: `gpu[i]` and `job[i]` index `gpus` and `jobs`; [start[i], end[i]) in epoch ms."""

    gpus: list[str]
    jobs: list[str]
    gpu: I64
    start: I64
    end: I64
    job: I64

    @classmethod
    def of(cls, ivs: Iterable[Interval]) -> IntervalTable:
        items = list(ivs)
        gpus, gpu = codes(list(map(_GPU, items)))
        jobs, job = codes(list(map(_JOB, items)))
        n = len(items)
        return cls(gpus, jobs, gpu, np.fromiter(map(_START, items), np.int64, n),
                   np.fromiter(map(_END, items), np.int64, n), job)

    def __len__(self) -> int:
        return len(self.start)

    def rows(self) -> list[Interval]:
        """The intervals as objects again."""
        return [Interval(self.gpus[g], s, e, self.jobs[j]) for g, s, e, j in
                zip(self.gpu.tolist(), self.start.tolist(), self.end.tolist(), self.job.tolist(), strict=True)]


_GPU, _JOB, _START, _END = (attrgetter(a) for a in ("gpu", "job", "start_ms", "end_ms"))


def _i64(values: Iterable[int] | I64) -> I64:
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class EnergyUse:
    """Joules one GPU drew over one piece of time from `start_ms` (a price holds over it), and the part drawn
    for each job attempt holding it."""

    gpu: str
    start_ms: int
    total_j: float
    by_job: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class JobCost:
    info: JobInfo
    gpu_ms: int = 0
    fixed_usd: Decimal = Decimal(0)
    power_usd: Decimal = Decimal(0)
    util_mean: float | None = None

    @property
    def usd(self) -> Decimal:
        return self.fixed_usd + self.power_usd


@dataclass
class GroupCost:
    """Fleet, allocated and idle cost of one (pool, model)."""

    pool: str
    model: str
    ownership: set[str] = field(default_factory=set)
    gpus: int = 0
    fleet_usd: Decimal = Decimal(0)
    allocated_usd: Decimal = Decimal(0)
    capacity_ms: int = 0
    allocated_ms: int = 0

    @property
    def idle_usd(self) -> Decimal:
        return self.fleet_usd - self.allocated_usd


@dataclass
class JobColumns:
    """Every attempt charged in the window, as columns (index i: `keys[i]`, its tags `tags.*[i]`)."""

    keys: list[str]
    tags: Attempts  # the attempts `keys`, in that order
    gpu_ms: I64
    fixed_micro: I64  # 1e-6 USD
    power_micro: I64
    util_mean: list[float | None]

    @property
    def usd_micro(self) -> I64:
        return self.fixed_micro + self.power_micro


@dataclass
class Use:
    """GPU-ms per (attempt, group): `job` indexes `JobColumns`, `group` the chargeback's sorted group keys."""

    job: I64
    group: I64
    ms: I64


@dataclass
class Chargeback:
    start_ms: int
    end_ms: int
    columns: JobColumns
    groups: dict[tuple[str, str], GroupCost]
    notes: list[str] = field(default_factory=list)
    # To share idle back in proportion to use.
    use: Use = field(default_factory=lambda: Use(_i64([]), _i64([]), _i64([])))

    @cached_property
    def jobs(self) -> dict[str, JobCost]:
        c = self.columns
        return {key: JobCost(info, ms, from_micro(f), from_micro(p), u) for key, info, ms, f, p, u in zip(
            c.keys, c.tags.infos(), c.gpu_ms.tolist(), c.fixed_micro.tolist(), c.power_micro.tolist(), c.util_mean,
            strict=True)}

    @property
    def fleet_usd(self) -> Decimal:
        return sum((g.fleet_usd for g in self.groups.values()), Decimal(0))

    @property
    def allocated_usd(self) -> Decimal:
        return from_micro(int(self.columns.usd_micro.sum()))

    @property
    def idle_usd(self) -> Decimal:
        return sum((g.idle_usd for g in self.groups.values()), Decimal(0))


def from_micro(micro: int) -> Decimal:
    return Decimal(micro).scaleb(-6)


def _micro(usd: Decimal) -> int:
    return int(usd.scaleb(6))


def _q(x: Decimal) -> Decimal:
    return x.quantize(MICRO, rounding=ROUND_HALF_EVEN)


@dataclass
class _Segments:
    """The rate segments of every GPU, interned: GPUs of one node share their timeline."""

    rate: list[Decimal] = field(default_factory=list)  # global id -> USD per ms
    group: list[tuple[str, str]] = field(default_factory=list)  # global id -> (pool, model)
    usage_only: set[int] = field(default_factory=set)
    by_gpu: dict[str, tuple[list[int], list[int], list[int]]] = field(default_factory=dict)  # (starts, ends, ids)
    groups: dict[tuple[str, str], GroupCost] = field(default_factory=dict)
    fleet_ms: dict[int, int] = field(default_factory=dict)  # id -> GPU-ms of capacity in window
    notes: list[str] = field(default_factory=list)


def _segments(gpus: dict[str, GpuCost], start_ms: int, end_ms: int) -> _Segments:
    out = _Segments()
    index: dict[tuple[tuple[str, str], int, int, Decimal, bool], int] = {}
    for uuid, gc in gpus.items():
        key = (gc.terms.pool, gc.terms.model)
        g = out.groups.get(key)
        if g is None:
            g = out.groups[key] = GroupCost(*key)
        g.ownership.add(gc.terms.ownership)
        g.gpus += 1
        out.notes.extend(gc.notes)
        starts, ends, ids = [], [], []
        for s in gc.segments:
            ident = (key, s.start_ms, s.end_ms, s.usd_per_ms, gc.usage_only)
            gid = index.get(ident)
            if gid is None:
                gid = index[ident] = len(out.rate)
                out.rate.append(s.usd_per_ms)
                out.group.append(key)
                if gc.usage_only:
                    out.usage_only.add(gid)
            starts.append(s.start_ms)
            ends.append(s.end_ms)
            ids.append(gid)
            if not gc.usage_only:
                lo, hi = max(s.start_ms, start_ms), min(s.end_ms, end_ms)
                if hi > lo:
                    out.fleet_ms[gid] = out.fleet_ms.get(gid, 0) + hi - lo
        out.by_gpu[uuid] = (starts, ends, ids)
    return out


@dataclass
class _Held:
    """GPU-ms per (attempt, segment) pair, and per attempt the ms held outside any segment (no cost)."""

    job: I64  # table job code per pair
    gid: I64
    ms: I64
    uncovered: I64  # per table job code
    present: npt.NDArray[np.bool_]  # per table job code: held any time in the window


def _held_ms(tab: IntervalTable, segs: _Segments, start_ms: int, end_ms: int) -> _Held:
    """Clip every interval to the window, cut it at its GPU's segment edges, sum the pieces per pair."""
    width = max(end_ms - start_ms, 0) + 1  # every GPU's window gets its own range of keys
    ss, se, sg = [], [], []  # the segments of the table's GPUs, clipped, keyed by (GPU code, time)
    for code, uuid in enumerate(tab.gpus):
        starts, ends, ids = segs.by_gpu[uuid]
        for a, b, gid in zip(starts, ends, ids, strict=True):
            lo, hi = max(a, start_ms), min(b, end_ms)
            if hi > lo:
                ss.append(code * width + lo - start_ms)
                se.append(code * width + hi - start_ms)
                sg.append(gid)
    seg_start, seg_end, seg_gid = _i64(ss), _i64(se), _i64(sg)
    njobs = len(tab.jobs)
    s = np.clip(tab.start, start_ms, end_ms)
    e = np.clip(tab.end, start_ms, end_ms)
    keep = e > s
    base = tab.gpu[keep] * width - start_ms
    ks, ke, job = base + s[keep], base + e[keep], tab.job[keep]
    present = np.bincount(job, minlength=njobs) > 0
    first = np.searchsorted(seg_end, ks, side="right")  # the first segment ending after the start
    last = np.searchsorted(seg_start, ke, side="left") - 1  # the last one starting before the end
    n = np.maximum(last - first + 1, 0)
    if len(n) and bool((n == 1).all()):  # the common case: each interval inside one segment
        piece, idx = np.arange(len(n)), first
    else:
        piece = np.repeat(np.arange(len(n)), n)
        idx = first[piece] + (np.arange(len(piece)) - (np.cumsum(n) - n)[piece])
    ms = np.minimum(ke[piece], seg_end[idx]) - np.maximum(ks[piece], seg_start[idx])
    covered = np.zeros(len(n), dtype=np.int64)
    np.add.at(covered, piece, ms)
    uncovered = np.zeros(njobs, dtype=np.int64)
    np.add.at(uncovered, job, (ke - ks) - covered)
    nseg = max(len(segs.rate), 1)
    pairs, pair_ms = sum_by(job[piece] * nseg + seg_gid[idx], ms, njobs * nseg)
    return _Held(pairs // nseg, pairs % nseg, pair_ms, uncovered, present)


def _price_micro(ms: I64, gid: I64, rates: list[Decimal]) -> I64:
    """Each `ms[i] * rates[gid[i]]` rounded half-even to the micro-dollar, exactly (Decimal where near a tie)."""
    rate_f = np.array([float(r) for r in rates] or [0.0], dtype=np.float64)
    x = ms.astype(np.float64) * rate_f[gid] * 1e6
    out = np.rint(x).astype(np.int64)
    unsure = (np.abs(x - np.floor(x) - 0.5) < NEAR_HALF) | (x >= FLOAT_EXACT_BELOW)
    for i in np.flatnonzero(unsure).tolist():
        out[i] = _micro(_q(int(ms[i]) * rates[int(gid[i])]))
    return out


def _fixed_costs(held: _Held, segs: _Segments) -> tuple[I64, I64]:
    """Per table job code: fixed cost (micro-dollars, 1e-6 USD per job and segment) and GPU-ms; the pools'
    fleet and allocated cost on the way."""
    njobs = len(held.uncovered)
    cost = _price_micro(held.ms, held.gid, segs.rate)
    fixed = np.zeros(njobs, dtype=np.int64)
    np.add.at(fixed, held.job, cost)
    gpu_ms = held.uncovered.copy()
    np.add.at(gpu_ms, held.job, held.ms)
    nseg = len(segs.rate)
    seg_cost = np.zeros(nseg, dtype=np.int64)
    np.add.at(seg_cost, held.gid, cost)
    seg_ms = np.zeros(nseg, dtype=np.int64)
    np.add.at(seg_ms, held.gid, held.ms)
    for gid in np.flatnonzero(seg_ms).tolist():
        g = segs.groups[segs.group[gid]]
        total = from_micro(int(seg_cost[gid]))
        g.allocated_usd += total
        g.allocated_ms += int(seg_ms[gid])
        if gid in segs.usage_only:
            g.fleet_usd += total  # no terms known: its fleet cost is its use, never idle
    for gid, ms in segs.fleet_ms.items():
        segs.groups[segs.group[gid]].fleet_usd += _q(ms * segs.rate[gid])
        segs.groups[segs.group[gid]].capacity_ms += ms
    return fixed, gpu_ms


def _power_costs(keys: dict[str, int], power: I64, groups: dict[tuple[str, str], GroupCost],
                 gpus: dict[str, GpuCost], energy: Iterable[EnergyUse], prices: dict[tuple[str, int], Decimal],
                 start_ms: int, end_ms: int) -> None:
    """Add each piece's priced energy to its pool's fleet cost and to the jobs (by column index) that drew it."""
    for use in energy:
        if not start_ms <= use.start_ms < end_ms or use.gpu not in gpus:
            continue
        price = prices.get((use.gpu, use.start_ms))
        if price is None:
            continue
        gc = gpus[use.gpu]
        g = groups[(gc.terms.pool, gc.terms.model)]
        g.fleet_usd += _q(Decimal(repr(use.total_j)) * price / J_PER_KWH)
        for job, joules in use.by_job:
            i = keys.get(job)
            if i is None:
                continue  # energy of an allocation outside the window
            cost = _q(Decimal(repr(joules)) * price / J_PER_KWH)
            power[i] += _micro(cost)
            g.allocated_usd += cost


def chargeback(
    intervals: list[Interval] | IntervalTable,
    jobs: Mapping[str, JobInfo],
    gpus: dict[str, GpuCost],
    start_ms: int,
    end_ms: int,
    energy: Iterable[EnergyUse] = (),
    kwh_price: dict[tuple[str, int], Decimal] | None = None,
    util: dict[str, tuple[float, float]] | None = None,
) -> Chargeback:
    """Cost of every job attempt and of the fleet over [start_ms, end_ms). Every interval's GPU must be in `gpus`."""
    tab = intervals if isinstance(intervals, IntervalTable) else IntervalTable.of(intervals)
    segs = _segments(gpus, start_ms, end_ms)
    held = _held_ms(tab, segs, start_ms, end_ms)
    fixed, gpu_ms = _fixed_costs(held, segs)
    present = np.flatnonzero(held.present)  # table job code of each column
    keys = tab.jobs if len(present) == len(tab.jobs) else list(map(tab.jobs.__getitem__, present.tolist()))
    power = np.zeros(len(keys), dtype=np.int64)
    util_mean: list[float | None] = [None] * len(keys)
    energy = list(energy)
    if energy or util:
        index = {k: i for i, k in enumerate(keys)}
        _power_costs(index, power, segs.groups, gpus, energy, kwh_price or {}, start_ms, end_ms)
        for job, (total, n) in (util or {}).items():
            i = index.get(job)
            if i is not None and n:
                util_mean[i] = total / n
    columns = JobColumns(keys, Attempts.of(jobs, keys), gpu_ms[present], fixed[present], power, util_mean)
    column_of = np.full(len(tab.jobs), -1, dtype=np.int64)
    column_of[present] = np.arange(len(present))
    group_keys = sorted(segs.groups)
    group_of = {g: i for i, g in enumerate(group_keys)}
    seg_group = _i64([group_of[g] for g in segs.group])
    use = Use(column_of[held.job], seg_group[held.gid], held.ms)
    uncovered = held.uncovered
    notes = segs.notes + [f"job {tab.jobs[c]} held GPUs {int(uncovered[c]) / MS_PER_HOUR:.2f} GPU-h outside their "
                          "declared terms (before a lease or a cloud GPU's `since`, or after a lease ended); that "
                          "time is charged 0" for c in sorted(np.flatnonzero(uncovered > 0).tolist(),
                                                              key=lambda c: tab.jobs[c])]
    return Chargeback(start_ms, end_ms, columns, segs.groups, list(dict.fromkeys(notes)), use)
