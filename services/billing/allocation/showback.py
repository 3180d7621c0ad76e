"""Showback: job costs grouped into rows, idle lines per pool and model, idle shared back, cents that add up. Pure.

Every printed line is its own exact amount rounded to the cent (half-up); every
total is the sum of the printed lines it totals (the rounding rule in
`allocation/__init__.py`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import numpy.typing as npt

from ..pricing import to_cents
from .chargeback import MS_PER_HOUR, Chargeback, JobColumns, from_micro
from .columns import I64, codes, sum_by


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


GROUP_KEYS: dict[str, str] = {"job": "job_id", "team": "team", "project": "project", "model": "model"}  # the tag
_RUNNING = "\0running"  # the key of attempts still running, when they are one line rather than rows


@dataclass
class _Tally:
    """Job costs summed per row key (index: `names`); `row[i]` is column i's row."""

    names: list[str]
    row: I64
    cost: I64  # micro-dollars
    ms: I64
    jobs: I64  # distinct job ids
    util_w: npt.NDArray[np.float64]  # utilization x GPU-ms
    util_ms: npt.NDArray[np.float64]  # GPU-ms with a utilization


def _sum(into: int, at: I64, values: I64) -> I64:
    out = np.zeros(into, dtype=np.int64)
    np.add.at(out, at, values)
    return out


def _tally(cb: Chargeback, tag: str, running: bool) -> _Tally:
    c = cb.columns
    is_running = c.tags.array("running")  # the attempts as columns: there may be a million
    if not running and is_running.any():
        keys = [_RUNNING if r else k for r, k in zip(is_running.tolist(), c.tags.column(tag), strict=True)]
        names, rows = codes(keys)
    else:
        names, rows = c.tags.codes(tag)
    n = len(names)
    w = np.zeros(n, dtype=np.float64)
    wm = np.zeros(n, dtype=np.float64)
    if c.util_mean.count(None) < len(c.util_mean):
        util = np.array(c.util_mean, dtype=np.float64)  # None -> nan
        has = ~np.isnan(util)
        np.add.at(w, rows[has], util[has] * c.gpu_ms[has])
        np.add.at(wm, rows[has], c.gpu_ms[has].astype(np.float64))
    return _Tally(names, rows, _sum(n, rows, c.usd_micro), _sum(n, rows, c.gpu_ms),
                  _distinct_jobs(c, rows, n), w, wm)


def _distinct_jobs(c: JobColumns, rows: I64, n: int) -> I64:
    """Job ids per row: its attempts, less each attempt with an earlier attempt of its job in the same row."""
    out = np.bincount(rows, minlength=n).astype(np.int64)
    later = np.flatnonzero(c.tags.array("attempt") > 1).tolist()
    if later:
        index = c.tags.index
        for i in later:
            info = c.tags.info(i)
            earlier = (index.get(f"{info.job_id}:{a}") for a in range(1, info.attempt))
            if any(j is not None and rows[j] == rows[i] for j in earlier):
                out[rows[i]] -= 1
    return out


def split_by_use(amount: int, users: dict[str, int]) -> dict[str, int]:
    """`amount` (whole units: micro-dollars, say) split in proportion to use, remainders by largest fraction,
    summing to `amount` exactly."""
    total_ms = sum(users.values())
    names = sorted(users)
    raw = [amount * users[n] for n in names]
    parts = [r // total_ms for r in raw]
    short = amount - sum(parts)
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] % total_ms), i))[:max(short, 0)]:
        parts[i] += 1
    return dict(zip(names, parts, strict=True))


def _idle_shares(cb: Chargeback, t: _Tally, group_keys: list[tuple[str, str]]
                 ) -> tuple[dict[str, Decimal], dict[tuple[str, str], Decimal]]:
    """Each row key's share of the idle cost, and per (pool, model) how much of its idle was shared to rows."""
    # A running attempt takes its idle share too, so the rows' shares stay proportional to use.
    n = max(len(t.names), 1)
    pairs, ms = sum_by(cb.use.group * n + t.row[cb.use.job], cb.use.ms, len(cb.groups) * n)
    use: dict[int, dict[str, int]] = defaultdict(dict)
    for pair, gms in zip(pairs.tolist(), ms.tolist(), strict=True):
        if gms:
            use[pair // n][t.names[pair % n]] = gms
    share: dict[str, int] = defaultdict(int)
    shared: dict[tuple[str, str], Decimal] = {g: Decimal(0) for g in group_keys}
    for i, g in enumerate(group_keys):
        idle = cb.groups[g].idle_usd
        users = use.get(i)
        if not users or idle == 0:
            continue
        for name, p in split_by_use(int(idle.scaleb(6)), users).items():
            share[name] += p
        shared[g] = idle - from_micro(share.pop(_RUNNING, 0))
    return {k: from_micro(v) for k, v in share.items()}, shared


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
    t = _tally(cb, GROUP_KEYS[by], running)
    group_keys = sorted(cb.groups)
    share: dict[str, Decimal] = {}
    shared = {g: Decimal(0) for g in group_keys}
    if share_idle:
        share, shared = _idle_shares(cb, t, group_keys)
    rows = []
    in_flight = Decimal("0.00")
    for i, k in enumerate(t.names):
        if k == _RUNNING:
            in_flight = to_cents(from_micro(int(t.cost[i])))
            continue
        cost, idle_share = to_cents(from_micro(int(t.cost[i]))), to_cents(share.get(k, Decimal(0)))
        rows.append(Row(
            key=k, jobs=int(t.jobs[i]), gpu_hours=(Decimal(int(t.ms[i])) / MS_PER_HOUR).quantize(Decimal("0.0001")),
            cost_usd=cost, idle_share_usd=idle_share, total_usd=cost + idle_share,
            efficiency_pct=round(float(t.util_w[i] / t.util_ms[i]), 1) if t.util_ms[i] else None,
        ))
    rows.sort(key=lambda r: (-r.total_usd, r.key))
    lines = _idle_lines(cb, group_keys, shared)
    zero = Decimal("0.00")
    allocated = sum((r.cost_usd for r in rows), zero)
    idle = sum((line.idle_usd for line in lines), zero)
    fleet = sum((line.fleet_usd for line in lines), zero)
    return Showback(by, rows, lines, fleet, allocated, idle, idle - sum((r.idle_share_usd for r in rows), zero),
                    share_idle, in_flight, fleet - allocated - in_flight - idle)
