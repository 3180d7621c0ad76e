"""Showback: job costs grouped into rows, idle lines per pool and model, idle shared back, cents that add up. Pure.

Shown amounts are cents apportioned by largest remainder (the rounding rule in `allocation/__init__.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal

from ..pricing import CENT, MICRO, to_cents
from .chargeback import MS_PER_HOUR, Chargeback, JobCost


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


GROUP_KEYS: dict[str, Callable[[JobCost], str]] = {
    "job": lambda j: j.info.job_id,
    "team": lambda j: j.info.team,
    "project": lambda j: j.info.project,
    "model": lambda j: j.info.model,
}
_RUNNING = "\0running"  # the key of attempts still running, when they are one line rather than rows


@dataclass
class _Tally:
    """Job costs summed per row key."""

    cost: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    ms: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    jobs: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    util_w: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    in_flight: Decimal = Decimal(0)


def _tally(cb: Chargeback, keyf: Callable[[JobCost], str], running: bool) -> _Tally:
    t = _Tally()
    for jc in cb.jobs.values():
        if jc.info.running and not running:
            t.in_flight += jc.usd
            continue
        k = keyf(jc)
        t.cost[k] += jc.usd
        t.ms[k] += jc.gpu_ms
        t.jobs[k].add(jc.info.job_id)
        if jc.util_mean is not None:
            t.util_w[k][0] += jc.util_mean * jc.gpu_ms
            t.util_w[k][1] += jc.gpu_ms
    return t


def _split(amount: Decimal, users: dict[str, int]) -> dict[str, Decimal]:
    """Exact micro-dollar split in proportion to use, remainders by largest fraction, summing to `amount`."""
    total_ms = sum(users.values())
    names = sorted(users)
    raw = [amount * users[n] / total_ms for n in names]
    parts = [r.quantize(MICRO, rounding=ROUND_FLOOR) for r in raw]
    short = int((amount - sum(parts, Decimal(0))) / MICRO)
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - parts[i]), i))[:max(short, 0)]:
        parts[i] += MICRO
    return dict(zip(names, parts, strict=True))


def _idle_shares(cb: Chargeback, keyf: Callable[[JobCost], str], running: bool,
                 group_keys: list[tuple[str, str]]) -> tuple[dict[str, Decimal], dict[tuple[str, str], Decimal]]:
    """Each row key's share of the idle cost, and per (pool, model) how much of its idle was shared to rows."""
    names = {job: (_RUNNING if jc.info.running and not running else keyf(jc)) for job, jc in cb.jobs.items()}
    use: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for gid, d in enumerate(cb.accs):
        for job, gms in d.items():
            # A running attempt takes its idle share too, so the rows' shares stay proportional to use.
            use[cb.seg_group[gid]][names[job]] += gms
    share: dict[str, Decimal] = defaultdict(Decimal)
    shared: dict[tuple[str, str], Decimal] = {g: Decimal(0) for g in group_keys}
    for g in group_keys:
        idle = cb.groups[g].idle_usd
        users = use.get(g)
        if not users or idle == 0:
            continue
        for n, p in _split(idle, users).items():
            share[n] += p
        shared[g] = idle - share.pop(_RUNNING, Decimal(0))
    return share, shared


def _idle_lines(cb: Chargeback, group_keys: list[tuple[str, str]],
                shared: dict[tuple[str, str], Decimal]) -> list[IdleLine]:
    out = []
    line_cents = apportion([cb.groups[g].fleet_usd for g in group_keys]
                           + [cb.groups[g].allocated_usd for g in group_keys])
    m = len(group_keys)
    for i, g in enumerate(group_keys):
        gc = cb.groups[g]
        out.append(IdleLine(
            pool=g[0], model=g[1], ownership=",".join(sorted(gc.ownership)), gpus=gc.gpus,
            fleet_usd=line_cents[i], allocated_usd=line_cents[m + i], idle_usd=line_cents[i] - line_cents[m + i],
            idle_pct=round(float(gc.idle_usd / gc.fleet_usd) * 100, 1) if gc.fleet_usd else None,
            shared_usd=to_cents(shared[g]),
        ))
    return out


def showback(cb: Chargeback, by: str = "team", share_idle: bool = False, running: bool = True) -> Showback:
    """Group job costs by job, team, project or model; idle per pool and model, optionally shared back by use.

    Without `running`, attempts that have not ended are one `running_usd` line instead of rows (a job is
    charged when it ends); their GPU time is never idle either way.
    """
    keyf = GROUP_KEYS[by]
    t = _tally(cb, keyf, running)
    keys = sorted(t.cost)
    group_keys = sorted(cb.groups)
    share: dict[str, Decimal] = defaultdict(Decimal)
    shared = {g: Decimal(0) for g in group_keys}
    if share_idle:
        share, shared = _idle_shares(cb, keyf, running, group_keys)
    fleet = cb.fleet_usd
    unshared = [cb.groups[g].idle_usd - shared[g] for g in group_keys]
    cents = apportion([t.cost[k] for k in keys] + [share.get(k, Decimal(0)) for k in keys] + unshared
                      + [t.in_flight], fleet)
    n = len(keys)
    rows = []
    for i, k in enumerate(keys):
        w = t.util_w.get(k)
        rows.append(Row(
            key=k, jobs=len(t.jobs[k]), gpu_hours=(Decimal(t.ms[k]) / MS_PER_HOUR).quantize(Decimal("0.0001")),
            cost_usd=cents[i], idle_share_usd=cents[n + i], total_usd=cents[i] + cents[n + i],
            efficiency_pct=round(w[0] / w[1], 1) if w and w[1] else None,
        ))
    rows.sort(key=lambda r: (-r.total_usd, r.key))
    unshared_cents = cents[2 * n:-1]
    return Showback(by, rows, _idle_lines(cb, group_keys, shared), to_cents(fleet),
                    sum(cents[:n], Decimal(0)) if n else Decimal("0.00"), to_cents(cb.idle_usd),
                    sum(unshared_cents, Decimal(0)) if unshared_cents else Decimal("0.00"), share_idle, cents[-1])
