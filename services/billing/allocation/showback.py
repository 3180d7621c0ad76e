"""Showback: job costs grouped into rows, idle lines per pool and model, idle shared back, cents that add up. Pure.

Every printed line is its own exact amount rounded to the cent (half-up); every
total is the sum of the printed lines it totals (the rounding rule in
`allocation/__init__.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal

from ..pricing import MICRO, to_cents
from .chargeback import MS_PER_HOUR, Chargeback, JobCost


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
    # The idle lines' fleet total minus (rows + running + idle lines): the two breakdowns rounded apart.
    rounding_usd: Decimal = Decimal("0.00")


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
    """Per (pool, model): fleet and idle each rounded on their own; allocated = the printed fleet - idle."""
    out = []
    for g in group_keys:
        gc = cb.groups[g]
        fleet, idle = to_cents(gc.fleet_usd), to_cents(gc.idle_usd)
        out.append(IdleLine(
            pool=g[0], model=g[1], ownership=",".join(sorted(gc.ownership)), gpus=gc.gpus,
            fleet_usd=fleet, allocated_usd=fleet - idle, idle_usd=idle,
            idle_pct=round(float(gc.idle_usd / gc.fleet_usd) * 100, 1) if gc.fleet_usd else None,
            shared_usd=to_cents(shared[g]),
        ))
    return out


def showback(cb: Chargeback, by: str = "team", share_idle: bool = False, running: bool = True) -> Showback:
    """Group job costs by job, team, project or model; idle per pool and model, optionally shared back by use.

    Without `running`, attempts that have not ended are one `running_usd` line instead of rows (a job is
    charged when it ends); their GPU time is never idle either way. Each line is its own exact amount to
    the cent; totals are sums of lines: allocated = rows, idle = idle lines, unshared idle = idle - rows'
    shares, fleet = idle lines' fleet = allocated + running + idle + `rounding_usd`.
    """
    keyf = GROUP_KEYS[by]
    t = _tally(cb, keyf, running)
    group_keys = sorted(cb.groups)
    share: dict[str, Decimal] = defaultdict(Decimal)
    shared = {g: Decimal(0) for g in group_keys}
    if share_idle:
        share, shared = _idle_shares(cb, keyf, running, group_keys)
    rows = []
    for k in sorted(t.cost):
        w = t.util_w.get(k)
        cost, idle_share = to_cents(t.cost[k]), to_cents(share.get(k, Decimal(0)))
        rows.append(Row(
            key=k, jobs=len(t.jobs[k]), gpu_hours=(Decimal(t.ms[k]) / MS_PER_HOUR).quantize(Decimal("0.0001")),
            cost_usd=cost, idle_share_usd=idle_share, total_usd=cost + idle_share,
            efficiency_pct=round(w[0] / w[1], 1) if w and w[1] else None,
        ))
    rows.sort(key=lambda r: (-r.total_usd, r.key))
    lines = _idle_lines(cb, group_keys, shared)
    zero = Decimal("0.00")
    allocated = sum((r.cost_usd for r in rows), zero)
    idle = sum((line.idle_usd for line in lines), zero)
    fleet = sum((line.fleet_usd for line in lines), zero)
    in_flight = to_cents(t.in_flight)
    return Showback(by, rows, lines, fleet, allocated, idle, idle - sum((r.idle_share_usd for r in rows), zero),
                    share_idle, in_flight, fleet - allocated - in_flight - idle)
