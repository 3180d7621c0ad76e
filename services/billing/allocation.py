"""Chargeback over a window: job costs, the idle line per pool and model, shown to the cent. Pure, no I/O.

Rounding rule (extends pricing.py):
- a job attempt's fixed cost is, per rate segment of the GPUs it held (a
  calendar month, a price period, a lease term), held milliseconds x USD per
  millisecond, kept to 1e-6 USD (half-even);
- a job attempt's power cost is, per GPU and hour, joules / 3.6e6 x USD/kWh,
  kept to 1e-6 USD;
- fleet cost per pool and model is computed the same way over every GPU's
  whole segment; idle = fleet - allocated, exactly;
- shown amounts are cents apportioned by largest remainder so that the shown
  lines (job/team/project rows plus idle lines) add up to the shown fleet total
  (the exact total rounded half-up). A line can therefore differ by one cent
  from its own rounding; the total never does.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal

from .ownership import GpuCost
from .pricing import CENT, MICRO, to_cents

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
    """Joules one GPU drew in one hour, and the part drawn for each job attempt holding it."""

    gpu: str
    hour_ms: int
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


def chargeback(
    intervals: list[Interval],
    jobs: dict[str, JobInfo],
    gpus: dict[str, GpuCost],
    start_ms: int,
    end_ms: int,
    energy: list[EnergyUse] = (),
    kwh_price: dict[tuple[str, int], Decimal] | None = None,
    util: dict[str, tuple[float, int]] | None = None,
) -> Chargeback:
    """Cost of every job attempt and of the fleet over [start_ms, end_ms). Every interval's GPU must be in `gpus`."""
    # Intern segments: GPUs of one node share their timeline, so one (job, segment) sum covers all of them.
    seg_rate: list[Decimal] = []
    seg_group: list[tuple[str, str]] = []
    seg_index: dict[tuple, int] = {}
    gpu_segs: dict[str, tuple[list[int], list[int], list[int]]] = {}  # uuid -> (starts, ends, global ids)
    groups: dict[tuple[str, str], GroupCost] = {}
    fleet_ms: dict[int, int] = defaultdict(int)  # global id -> GPU-ms of fleet capacity in the window
    notes: list[str] = []
    for uuid, gc in gpus.items():
        key = (gc.terms.pool, gc.terms.model)
        g = groups.get(key)
        if g is None:
            g = groups[key] = GroupCost(*key)
        g.ownership.add(gc.terms.ownership)
        g.gpus += 1
        notes.extend(gc.notes)
        starts, ends, ids = [], [], []
        for s in gc.segments:
            ident = (key, s.start_ms, s.end_ms, s.usd_per_ms, gc.usage_only)
            gid = seg_index.get(ident)
            if gid is None:
                gid = seg_index[ident] = len(seg_rate)
                seg_rate.append(s.usd_per_ms)
                seg_group.append(key)
            starts.append(s.start_ms)
            ends.append(s.end_ms)
            ids.append(gid)
            if not gc.usage_only:
                lo, hi = max(s.start_ms, start_ms), min(s.end_ms, end_ms)
                if hi > lo:
                    fleet_ms[gid] += hi - lo
        gpu_segs[uuid] = (starts, ends, ids)
    usage_only = {gid for ident, gid in seg_index.items() if ident[4]}

    # Hot loop (a million intervals): locals only, one small-dict update per interval in the common
    # case of an interval inside one rate segment. One dict per segment keeps keys plain strings.
    accs: list[dict[str, int]] = [{} for _ in seg_rate]
    uncovered: dict[str, int] = defaultdict(int)  # held outside any segment (before a lease began): no cost
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
        starts, ends, ids = gpu_segs[iv.gpu]
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

    zero = Decimal(0)
    job_fixed: dict[str, Decimal] = {}
    job_ms: dict[str, int] = dict(uncovered)
    fixed_get, ms_get = job_fixed.get, job_ms.get
    for gid, d in enumerate(accs):
        if not d:
            continue
        rate = seg_rate[gid]
        total_cost, total_ms = zero, 0
        for job, ms in d.items():
            cost = (ms * rate).quantize(MICRO, rounding=ROUND_HALF_EVEN)
            job_fixed[job] = fixed_get(job, zero) + cost
            job_ms[job] = ms_get(job, 0) + ms
            total_cost += cost
            total_ms += ms
        g = groups[seg_group[gid]]
        g.allocated_usd += total_cost
        g.allocated_ms += total_ms
        if gid in usage_only:
            g.fleet_usd += total_cost  # no terms known: its fleet cost is its use, never idle
    out: dict[str, JobCost] = {job: JobCost(jobs[job], ms, job_fixed.get(job, zero)) for job, ms in job_ms.items()}
    for gid, ms in fleet_ms.items():
        groups[seg_group[gid]].fleet_usd += _q(ms * seg_rate[gid])
        groups[seg_group[gid]].capacity_ms += ms

    prices = kwh_price or {}
    for use in energy:
        if not start_ms <= use.hour_ms < end_ms or use.gpu not in gpus:
            continue
        price = prices.get((use.gpu, use.hour_ms))
        if price is None:
            continue
        gc = gpus[use.gpu]
        g = groups[(gc.terms.pool, gc.terms.model)]
        g.fleet_usd += _q(Decimal(repr(use.total_j)) * price / J_PER_KWH)
        for job, joules in use.by_job:
            if job not in out:
                continue  # energy of an hour whose allocation lies outside the window
            cost = _q(Decimal(repr(joules)) * price / J_PER_KWH)
            out[job].power_usd += cost
            g.allocated_usd += cost
    for job, (total, n) in (util or {}).items():
        if job in out and n:
            out[job].util_mean = total / n
    return Chargeback(start_ms, end_ms, out, groups, list(dict.fromkeys(notes)), accs, seg_group)


def apportion(amounts: list[Decimal], total: Decimal | None = None) -> list[Decimal]:
    """Cents for each exact amount, by largest remainder, summing to `total` (default sum) rounded half-up."""
    target = to_cents(sum(amounts, Decimal(0)) if total is None else total)
    floors = [a.quantize(CENT, rounding=ROUND_FLOOR) for a in amounts]
    short = int((target - sum(floors, Decimal(0))) / CENT)
    order = sorted(range(len(amounts)), key=lambda i: (-(amounts[i] - floors[i]), i))
    for i in order[:max(short, 0)]:
        floors[i] += CENT
    return floors


@dataclass
class Row:
    key: str
    jobs: int
    gpu_hours: Decimal
    cost_usd: Decimal
    idle_share_usd: Decimal
    total_usd: Decimal
    efficiency_pct: float | None


@dataclass
class IdleLine:
    pool: str
    model: str
    ownership: str
    gpus: int
    fleet_usd: Decimal
    allocated_usd: Decimal
    idle_usd: Decimal
    idle_pct: float | None
    shared_usd: Decimal


@dataclass
class Showback:
    by: str
    rows: list[Row]
    idle: list[IdleLine]
    fleet_usd: Decimal
    allocated_usd: Decimal
    idle_usd: Decimal
    unshared_idle_usd: Decimal
    share_idle: bool
    running_usd: Decimal = Decimal("0.00")  # attempts still running, when not shown as rows


GROUP_KEYS = {
    "job": lambda j: j.info.job_id,
    "team": lambda j: j.info.team,
    "project": lambda j: j.info.project,
    "model": lambda j: j.info.model,
}


def showback(cb: Chargeback, by: str = "team", share_idle: bool = False, running: bool = True) -> Showback:
    """Group job costs by job, team, project or model; idle per pool and model, optionally shared back by use.

    Without `running`, attempts that have not ended are one `running_usd` line instead of rows (a job is
    charged when it ends); their GPU time is never idle either way.
    """
    keyf = GROUP_KEYS[by]
    in_flight = Decimal(0)
    cost: dict[str, Decimal] = defaultdict(Decimal)
    ms: dict[str, int] = defaultdict(int)
    jobs: dict[str, set[str]] = defaultdict(set)
    util_w: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    use: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for jc in cb.jobs.values():
        if jc.info.running and not running:
            in_flight += jc.usd
            continue
        k = keyf(jc)
        cost[k] += jc.usd
        ms[k] += jc.gpu_ms
        jobs[k].add(jc.info.job_id)
        if jc.util_mean is not None:
            util_w[k][0] += jc.util_mean * jc.gpu_ms
            util_w[k][1] += jc.gpu_ms
    keys = sorted(cost)
    if share_idle:
        names = {job: ("\0running" if jc.info.running and not running else keyf(jc)) for job, jc in cb.jobs.items()}
        for gid, d in enumerate(cb.accs):
            for job, gms in d.items():
                # A running attempt takes its idle share too, so the rows' shares stay proportional to use.
                use[cb.seg_group[gid]][names[job]] += gms
    share: dict[str, Decimal] = defaultdict(Decimal)
    group_keys = sorted(cb.groups)
    shared: dict[tuple[str, str], Decimal] = {g: Decimal(0) for g in group_keys}
    if share_idle:
        for g in group_keys:
            idle = cb.groups[g].idle_usd
            users = use.get(g)
            if not users or idle == 0:
                continue
            total_ms = sum(users.values())
            names = sorted(users)
            # Exact micro-dollar split: proportional, remainders by largest fraction, so shares sum to the idle.
            raw = [idle * users[n] / total_ms for n in names]
            parts = [r.quantize(MICRO, rounding=ROUND_FLOOR) for r in raw]
            short = int((idle - sum(parts, Decimal(0))) / MICRO)
            for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - parts[i]), i))[:max(short, 0)]:
                parts[i] += MICRO
            for n, p in zip(names, parts):
                share[n] += p
            shared[g] = idle - share.pop("\0running", Decimal(0))
    fleet = cb.fleet_usd
    unshared = [cb.groups[g].idle_usd - shared[g] for g in group_keys]
    cents = apportion([cost[k] for k in keys] + [share[k] for k in keys] + unshared + [in_flight], fleet)
    n = len(keys)
    rows = []
    for i, k in enumerate(keys):
        w = util_w.get(k)
        rows.append(Row(
            key=k, jobs=len(jobs[k]), gpu_hours=(Decimal(ms[k]) / MS_PER_HOUR).quantize(Decimal("0.0001")),
            cost_usd=cents[i], idle_share_usd=cents[n + i], total_usd=cents[i] + cents[n + i],
            efficiency_pct=round(w[0] / w[1], 1) if w and w[1] else None,
        ))
    rows.sort(key=lambda r: (-r.total_usd, r.key))
    idle_lines = []
    line_cents = apportion([cb.groups[g].fleet_usd for g in group_keys] + [cb.groups[g].allocated_usd for g in group_keys])
    m = len(group_keys)
    for i, g in enumerate(group_keys):
        gc = cb.groups[g]
        idle_lines.append(IdleLine(
            pool=g[0], model=g[1], ownership=",".join(sorted(gc.ownership)), gpus=gc.gpus,
            fleet_usd=line_cents[i], allocated_usd=line_cents[m + i], idle_usd=line_cents[i] - line_cents[m + i],
            idle_pct=round(float(gc.idle_usd / gc.fleet_usd) * 100, 1) if gc.fleet_usd else None,
            shared_usd=to_cents(shared[g]),
        ))
    unshared_cents = cents[2 * n:-1]
    return Showback(by, rows, idle_lines, to_cents(fleet), sum(cents[:n], Decimal(0)) if n else Decimal("0.00"),
                    to_cents(cb.idle_usd), sum(unshared_cents, Decimal(0)) if unshared_cents else Decimal("0.00"),
                    share_idle, cents[-1])
