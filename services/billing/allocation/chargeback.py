"""Chargeback over a window: each job attempt's cost and each pool's fleet, allocated and idle cost. Pure, no I/O.

Exact amounts, kept to 1e-6 USD (the rounding rule in `allocation/__init__.py`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal

from ..ownership import GpuCost
from ..pricing import MICRO

J_PER_KWH = Decimal(3_600_000)
MS_PER_HOUR = 3_600_000


@dataclass(frozen=True, slots=True)
class Interval:
    """One GPU held by one job attempt, [start_ms, end_ms)."""

    gpu: str
    start_ms: int
    end_ms: int
    job: str  # "<job_id>:<attempt>"


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    attempt: int
    team: str
    project: str
    model: str
    running: bool = False  # not ended yet: held up to the report's end


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
class Chargeback:
    start_ms: int
    end_ms: int
    jobs: dict[str, JobCost]
    groups: dict[tuple[str, str], GroupCost]
    notes: list[str] = field(default_factory=list)
    # Per segment id, job -> GPU-ms, and each segment's (pool, model): to share idle back in proportion to use.
    accs: list[dict[str, int]] = field(default_factory=list)
    seg_group: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fleet_usd(self) -> Decimal:
        return sum((g.fleet_usd for g in self.groups.values()), Decimal(0))

    @property
    def allocated_usd(self) -> Decimal:
        return sum((j.usd for j in self.jobs.values()), Decimal(0))

    @property
    def idle_usd(self) -> Decimal:
        return sum((g.idle_usd for g in self.groups.values()), Decimal(0))


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
    fleet_ms: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # id -> GPU-ms of capacity in window
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
                    out.fleet_ms[gid] += hi - lo
        out.by_gpu[uuid] = (starts, ends, ids)
    return out


def _held_ms(intervals: list[Interval], segs: _Segments, start_ms: int,
             end_ms: int) -> tuple[list[dict[str, int]], dict[str, int]]:
    """GPU-ms per segment and job within the window, and per job the ms held outside any segment (no cost)."""
    # Hot loop (a million intervals): locals only, one small-dict update per interval in the common
    # case of an interval inside one rate segment. One dict per segment keeps keys plain strings.
    accs: list[dict[str, int]] = [{} for _ in segs.rate]
    uncovered: dict[str, int] = defaultdict(int)  # held before a lease began, say
    by_gpu = segs.by_gpu
    bisect_right = bisect.bisect_right
    for iv in intervals:
        s = iv.start_ms
        e = iv.end_ms
        if s < start_ms:
            s = start_ms
        if e > end_ms:
            e = end_ms
        if e <= s:
            continue
        starts, ends, ids = by_gpu[iv.gpu]
        i = bisect_right(starts, s) - 1
        if i >= 0 and e <= ends[i]:
            d = accs[ids[i]]
            job = iv.job
            d[job] = d.get(job, 0) + e - s
            continue
        if i < 0:
            i = 0
        covered = 0
        n = len(starts)
        while i < n and starts[i] < e:
            lo = s if s > starts[i] else starts[i]
            hi = e if e < ends[i] else ends[i]
            if hi > lo:
                d = accs[ids[i]]
                d[iv.job] = d.get(iv.job, 0) + hi - lo
                covered += hi - lo
            i += 1
        if covered < e - s:
            uncovered[iv.job] += e - s - covered
    return accs, uncovered


def _fixed_costs(accs: list[dict[str, int]], uncovered: dict[str, int], segs: _Segments,
                 jobs: dict[str, JobInfo]) -> dict[str, JobCost]:
    """Each job's fixed cost (1e-6 USD per job and segment) and the pools' fleet and allocated cost."""
    zero = Decimal(0)
    job_fixed: dict[str, Decimal] = {}
    job_ms: dict[str, int] = dict(uncovered)
    fixed_get, ms_get = job_fixed.get, job_ms.get
    for gid, d in enumerate(accs):
        if not d:
            continue
        rate = segs.rate[gid]
        total_cost, total_ms = zero, 0
        for job, ms in d.items():
            cost = (ms * rate).quantize(MICRO, rounding=ROUND_HALF_EVEN)
            job_fixed[job] = fixed_get(job, zero) + cost
            job_ms[job] = ms_get(job, 0) + ms
            total_cost += cost
            total_ms += ms
        g = segs.groups[segs.group[gid]]
        g.allocated_usd += total_cost
        g.allocated_ms += total_ms
        if gid in segs.usage_only:
            g.fleet_usd += total_cost  # no terms known: its fleet cost is its use, never idle
    for gid, ms in segs.fleet_ms.items():
        segs.groups[segs.group[gid]].fleet_usd += _q(ms * segs.rate[gid])
        segs.groups[segs.group[gid]].capacity_ms += ms
    return {job: JobCost(jobs[job], ms, job_fixed.get(job, zero)) for job, ms in job_ms.items()}


def _power_costs(out: dict[str, JobCost], groups: dict[tuple[str, str], GroupCost], gpus: dict[str, GpuCost],
                 energy: Iterable[EnergyUse], prices: dict[tuple[str, int], Decimal], start_ms: int,
                 end_ms: int) -> None:
    """Add each piece's priced energy to its pool's fleet cost and to the jobs that drew it."""
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
            if job not in out:
                continue  # energy of an allocation outside the window
            cost = _q(Decimal(repr(joules)) * price / J_PER_KWH)
            out[job].power_usd += cost
            g.allocated_usd += cost


def chargeback(
    intervals: list[Interval],
    jobs: dict[str, JobInfo],
    gpus: dict[str, GpuCost],
    start_ms: int,
    end_ms: int,
    energy: Iterable[EnergyUse] = (),
    kwh_price: dict[tuple[str, int], Decimal] | None = None,
    util: dict[str, tuple[float, float]] | None = None,
) -> Chargeback:
    """Cost of every job attempt and of the fleet over [start_ms, end_ms). Every interval's GPU must be in `gpus`."""
    segs = _segments(gpus, start_ms, end_ms)
    accs, uncovered = _held_ms(intervals, segs, start_ms, end_ms)
    out = _fixed_costs(accs, uncovered, segs, jobs)
    _power_costs(out, segs.groups, gpus, energy, kwh_price or {}, start_ms, end_ms)
    for job, (total, n) in (util or {}).items():
        if job in out and n:
            out[job].util_mean = total / n
    notes = segs.notes + [f"job {job} held GPUs {ms / MS_PER_HOUR:.2f} GPU-h outside their declared terms "
                          "(before a lease or a cloud GPU's `since`, or after a lease ended); that time is charged 0"
                          for job, ms in sorted(uncovered.items()) if ms > 0]
    return Chargeback(start_ms, end_ms, out, segs.groups, list(dict.fromkeys(notes)), accs, segs.group)
