"""Costs over a window from what the store holds: GPU cost timelines, power prices, the chargeback. Pure.

The shell reads one `Inputs` per question (the ledger's columns in the window and
their charged intervals, inventory's terms, the GPUs' samples around the
instants that matter: `sample_points`) and the price book in force; every figure is computed from
them here, so a replay that rebuilds the inputs gives identical totals. Energy
is priced per owned GPU and UTC day piece of the window (price periods start on
days), each piece's joules and each attempt's part of them from the samples
(energy.py), so any window and any job counts exactly the energy of its time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np

from whaleflux.shared.contracts import Asset

from . import allocation as alloc
from .allocation import Chargeback, EnergyUse, Interval, IntervalTable, JobInfo
from .budgets import day_windows
from .charged import Charged, charged_table
from .energy import Series
from .metering import Overlap, UsageRecord
from .ownership import GpuCost, GpuTerms, from_ms, gpu_cost, power_price, terms_from_assets, to_ms
from .pricebook import PriceBook, day_start
from .usage import UsageColumns

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
__all__ = ["Costed", "Inputs", "compute", "daily_spend", "day_start", "energy_uses", "gpu_costs",
           "inventory_terms", "job_window", "kwh_prices", "sample_points", "utilization"]


@dataclass
class Inputs:
    """Everything one report needs, read from the store once."""

    usage: UsageColumns  # the ledger's records overlapping the window
    charged: Charged  # their intervals with every GPU's time charged once (running ones held until now)
    terms: dict[str, GpuTerms]
    series: Series  # the GPUs' samples around `sample_points`
    pricing: dict[str, Any]  # where the ownership terms came from, for the report


@dataclass
class Costed:
    """A chargeback with everything it was computed from."""

    cb: Chargeback
    inputs: Inputs
    gpus: dict[str, GpuCost]
    table: IntervalTable  # the charged intervals
    jobs: Mapping[str, JobInfo]
    book: PriceBook
    energy: list[EnergyUse]
    overlaps: list[Overlap]

    @property
    def intervals(self) -> list[Interval]:
        return self.table.rows()


def inventory_terms(url: str, fetched_at: str | None, assets: list[Asset], error: str | None,
                    error_at: str | None) -> tuple[dict[str, GpuTerms], dict[str, Any]]:
    """Terms per GPU from inventory's last good answer, and the report's account of where they came from."""
    info: dict[str, Any] = {"url": url, "fetched_at": None, "error": error, "error_at": error_at}
    if fetched_at is None:
        info["basis"] = ("price book model defaults (inventory unreachable: ownership unknown, reference prices, "
                         "no idle line)")
        return {}, info
    info["fetched_at"] = fetched_at
    info["basis"] = "inventory ownership terms" + (" (cached; inventory unreachable now)" if error else "")
    return terms_from_assets(assets), info


def gpu_costs(inp: Inputs, book: PriceBook, start: datetime, end: datetime) -> tuple[dict[str, GpuCost], list[str]]:
    """Fixed-cost timelines of every GPU in the fleet and every GPU a job held."""
    notes = []
    terms = dict(inp.terms)
    u = inp.usage
    for g, i in u.first_holders():
        if g not in terms:
            if inp.terms:
                notes.append(f"GPU {g} (job {u.job_id[i]}) is not in inventory; priced at the {u.model[i]} default")
            terms[g] = GpuTerms(uuid=g, model=u.model[i], ownership="unknown", pool=u.cluster[i] or "unknown",
                                node=u.node[i], cluster=u.cluster[i])
    out = {}
    for uuid, t in terms.items():
        try:
            out[uuid] = gpu_cost(t, book, start, end)
        except ValueError as exc:  # gpu_cost's "no price for ...": charged nothing, and said so
            notes.append(f"{exc}: charged 0 until the price book has one")
            out[uuid] = GpuCost(t, usage_only=True)
    return out, list(dict.fromkeys(notes))


def _day_edges(start_ms: int, end_ms: int) -> list[int]:
    """[start, the UTC midnights inside, end]: the pieces energy is priced by."""
    first = start_ms - start_ms % DAY_MS + DAY_MS
    return [start_ms, *range(first, end_ms, DAY_MS), end_ms]


def sample_points(tab: IntervalTable, terms: dict[str, GpuTerms], start: datetime,
                  end: datetime) -> dict[str, set[int]]:
    """The instants per GPU whose samples a window's figures need: the edges of every charged interval
    (clipped to the window) and, for owned GPUs (power billed as measured), the window's day pieces."""
    lo, hi = to_ms(start), to_ms(end)
    points: dict[str, set[int]] = defaultdict(set)
    for uuid, t in terms.items():
        if t.ownership == "owned":
            points[uuid].update(_day_edges(lo, hi))
    a, b = np.maximum(tab.start, lo), np.minimum(tab.end, hi)
    inside = a < b
    g, a, b = tab.gpu[inside], a[inside], b[inside]
    for code in np.unique(g).tolist():
        at = g == code
        points[tab.gpus[code]].update(a[at].tolist(), b[at].tolist())
    return points


def _rows(ivs: list[Interval] | IntervalTable, gpus: Collection[str]) -> Iterator[tuple[str, int, int, str]]:
    """(GPU, start, end, attempt) of the intervals on `gpus`, in order."""
    tab = ivs if isinstance(ivs, IntervalTable) else IntervalTable.of(ivs)
    wanted = [i for i, g in enumerate(tab.gpus) if g in gpus]
    on = np.isin(tab.gpu, np.asarray(wanted, dtype=np.int64))
    for g, s, e, j in zip(tab.gpu[on].tolist(), tab.start[on].tolist(), tab.end[on].tolist(), tab.job[on].tolist(),
                          strict=True):
        yield tab.gpus[g], s, e, tab.jobs[j]


def energy_uses(series: Series, ivs: list[Interval] | IntervalTable, gpus: dict[str, GpuCost], start_ms: int,
                end_ms: int) -> list[EnergyUse]:
    """Joules per owned GPU and day piece of the window, with each attempt's part (its intervals in the piece)."""
    owned = {u for u, gc in gpus.items() if gc.terms.ownership == "owned" and u in series.by_gpu}
    by_gpu: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for gpu, s, e, job in _rows(ivs, owned):
        by_gpu[gpu].append((s, e, job))
    out = []
    for uuid, gc in gpus.items():
        if gc.terms.ownership != "owned" or uuid not in series.by_gpu:
            continue
        edges = _day_edges(start_ms, end_ms)
        for a, b in zip(edges, edges[1:], strict=False):
            parts: dict[str, float] = defaultdict(float)
            for s, e, job in by_gpu.get(uuid, ()):
                lo, hi = max(s, a), min(e, b)
                if lo < hi:
                    parts[job] += series.joules(uuid, lo, hi)
            total = series.joules(uuid, a, b)
            if total > 0 or parts:
                out.append(EnergyUse(uuid, a, total, tuple(sorted((j, x) for j, x in parts.items() if x > 0))))
    return out


def utilization(series: Series, ivs: list[Interval] | IntervalTable, start_ms: int,
                end_ms: int) -> dict[str, tuple[float, float]]:
    """Attempt -> (utilization % x ms, ms covered) of its GPUs over its intervals in the window."""
    out: dict[str, tuple[float, float]] = {}
    for gpu, s, e, job in _rows(ivs, series.by_gpu):  # a GPU without samples has no utilization
        u, c = series.utilization(gpu, max(s, start_ms), min(e, end_ms))
        if c > 0:
            pu, pc = out.get(job, (0.0, 0.0))
            out[job] = (pu + u, pc + c)
    return out


def kwh_prices(energy: list[EnergyUse], gpus: dict[str, GpuCost], book: PriceBook) -> dict[tuple[str, int], Decimal]:
    """USD per kWh for each (GPU, piece) with energy whose price is billed on measured power (owned GPUs)."""
    prices = {}
    for use in energy:
        gc = gpus.get(use.gpu)
        if gc is not None:
            p = power_price(gc.terms, book, from_ms(use.start_ms))
            if p is not None:
                prices[(use.gpu, use.start_ms)] = p
    return prices


def compute(inp: Inputs, book: PriceBook, start: datetime, end: datetime) -> Costed:
    """Chargeback over [start, end) (attempts still running held until the `now` of `inp.charged`)."""
    gpus, notes = gpu_costs(inp, book, start, end)
    table, jobs, overlaps = inp.charged
    lo, hi = to_ms(start), to_ms(end)
    energy = energy_uses(inp.series, table, gpus, lo, hi)
    cb = alloc.chargeback(table, jobs, gpus, lo, hi, energy, kwh_prices(energy, gpus, book),
                          utilization(inp.series, table, lo, hi))
    cb.notes = notes + overlap_notes(overlaps, lo, hi) + cb.notes
    return Costed(cb, inp, gpus, table, jobs, book, energy, overlaps)


def charged_intervals(usage: UsageColumns, now: datetime) -> Charged:
    """The records' intervals with every GPU's time charged once (as columns), and the overlaps that were cut."""
    return charged_table(usage, to_ms(now))


def overlap_notes(overlaps: list[Overlap], start_ms: int, end_ms: int) -> list[str]:
    """One note per overlap within the window: which GPU, which attempts, how long, who was charged."""
    out = []
    for o in overlaps:
        a, b = max(o.start_ms, start_ms), min(o.end_ms, end_ms)
        if a < b:
            out.append(f"GPU {o.gpu} was allocated to both {o.kept} and {o.dropped} from {from_ms(a).isoformat()} "
                       f"for {(b - a) / HOUR_MS:.2f} h: charged once, to {o.kept} (allocated first)")
    return out


def job_window(record: UsageRecord, now: datetime) -> tuple[datetime, datetime]:
    """The window one attempt's cost is computed over: its whole allocation (at least 1 ms)."""
    end = record.ended_at or now
    if end <= record.started_at:
        end = record.started_at + timedelta(milliseconds=1)
    return record.started_at, end


def daily_spend(inp: Inputs, book: PriceBook, first: date, now: datetime) -> dict[tuple[str, str], dict[date, Decimal]]:
    """Spend per UTC day from `first` to now, per (scope, name): cluster fleet cost, team and project allocated."""
    start = day_start(first)
    gpus, _ = gpu_costs(inp, book, start, now)
    table, jobs, _ = inp.charged  # columns once for every day's chargeback
    energy = energy_uses(inp.series, table, gpus, to_ms(start), to_ms(now))
    prices = kwh_prices(energy, gpus, book)
    daily: dict[tuple[str, str], dict[date, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for lo, hi in day_windows(first, now):
        day_gpus = {u: gpu_cost(g.terms, book, lo, hi) if not g.usage_only or g.segments else g
                    for u, g in gpus.items()}
        cb = alloc.chargeback(table, jobs, day_gpus, to_ms(lo), to_ms(hi), energy, prices)
        d = lo.date()
        daily[("cluster", "all")][d] += cb.fleet_usd
        for jc in cb.jobs.values():
            daily[("team", jc.info.team)][d] += jc.usd
            daily[("project", jc.info.project)][d] += jc.usd
    return daily
