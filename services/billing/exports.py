"""Exports of a window's costs: CSV, FOCUS 1.3 cost and usage rows, FOCUS 1.3 contract commitments. Pure, no I/O.

FOCUS (FinOps Open Cost and Usage Specification) 1.3 (`FOCUS_VERSION`), columns
from `tests/data/focus/focus-1.3-columns.csv` (the 1.2 columns stay, ProviderName
and PublisherName beside their 1.3 replacements ServiceProviderName and
HostProviderName). A lease is a contract commitment: its usage, idle and fee
rows carry `CommitmentDiscountId` (the contract id), `CommitmentDiscountStatus`
(`Used` for job rows, `Unused` for the lease's idle time) and `ContractApplied`;
`commitment_rows` is the contract commitment dataset, one row per lease
contract. Cost and usage rows:

- Usage, one per job attempt, GPU and rate segment (a calendar month, a price
  period): `EffectiveCost` = its share of the GPU's cost, `ConsumedQuantity`
  = GPU-hours held, `ResourceId` = GPU UUID, `x_Team`, `x_Project`,
  `x_JobId`, `x_GpuUuid`;
- Usage, one per job attempt, owned GPU and month for measured power;
- Usage, idle: one per GPU and segment for the time no job held it, and one
  per owned GPU and month for power drawn while idle (`x_Idle` = true);
- Purchase, Recurring: one per leased GPU and month of its term overlapping
  the window, `BilledCost` = the monthly fee for the part of that month inside
  the window and the term (owed whatever the use),
  `EffectiveCost` 0: that fee reaches usage and idle rows as their
  `EffectiveCost`.

Amortized costs (owned purchase, lease fees) appear as `EffectiveCost` with
`BilledCost` 0 on usage rows; cloud time and power are billed as used. So the
sum of `EffectiveCost` is the fleet cost of the window, and each `BilledCost`
is what an invoice said. Money is kept to 1e-6 USD (the rounding rule in
allocation/__init__.py); times are UTC, `YYYY-MM-DDTHH:MM:SSZ`, usage periods widened
to whole seconds.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from .allocation import Chargeback, EnergyUse, Interval, JobInfo
from .focus_split import UNALLOCATED, Row, split_idle
from .ownership import GpuCost, from_ms, lease_term, month_start, next_month, to_ms
from .pricing import MICRO

MS_PER_HOUR = Decimal(3_600_000)
J_PER_KWH = Decimal(3_600_000)
_PRICING_CATEGORY = {"cloud": "Standard", "leased": "Committed", "unknown": "Standard"}
FOCUS_VERSION = "1.3"

FOCUS_COLUMNS = [
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
    "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency",
    "ChargePeriodEnd", "ChargePeriodStart", "ConsumedQuantity", "ConsumedUnit", "ContractedCost",
    "ContractedUnitPrice", "EffectiveCost", "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory",
    "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId", "RegionName", "ResourceId",
    "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "SkuId", "Tags",
    "ServiceProviderName", "HostProviderName", "CommitmentDiscountCategory", "CommitmentDiscountId",
    "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType", "ContractApplied",
    "AllocatedMethodId", "AllocatedMethodDetails", "AllocatedResourceId", "AllocatedResourceName", "AllocatedTags",
    "x_Team", "x_Project", "x_JobId", "x_Attempt", "x_GpuUuid", "x_GpuModel", "x_Ownership", "x_Pool", "x_Idle",
]


def _q(x: Decimal) -> Decimal:
    return x.quantize(MICRO, rounding=ROUND_HALF_EVEN)


def focus_time(ms: int, up: bool = False) -> str:
    """FOCUS date-time: whole seconds, UTC, `Z`."""
    secs = -(-ms // 1000) if up else ms // 1000
    return from_ms(secs * 1000).strftime("%Y-%m-%dT%H:%M:%SZ")


def _d(x: Decimal | None) -> str | None:
    return None if x is None else format(x.normalize() if x == x.to_integral() else x, "f")


class FocusContext:
    """Account names and who issues the invoice for each ownership."""

    def __init__(self, account_id: str = "whaleflux", account_name: str = "WhaleFlux GPU fleet",
                 owner: str = "WhaleFlux"):
        self.account_id = account_id
        self.account_name = account_name
        self.owner = owner

    def issuer(self, gc: GpuCost) -> str:
        t = gc.terms
        if t.ownership == "leased":
            return t.lease_provider or "lessor"
        if t.ownership == "cloud":
            return t.cluster or "cloud provider"
        return self.owner




def _base(ctx: FocusContext, gc: GpuCost, start_ms: int, end_ms: int) -> Row:
    t = gc.terms
    period = month_start(from_ms(start_ms))
    return {
        "BillingAccountId": ctx.account_id, "BillingAccountName": ctx.account_name, "BillingCurrency": "USD",
        "BillingPeriodStart": focus_time(to_ms(period)), "BillingPeriodEnd": focus_time(to_ms(next_month(period))),
        "ChargeClass": None, "ChargePeriodStart": focus_time(start_ms), "ChargePeriodEnd": focus_time(end_ms, up=True),
        "InvoiceIssuerName": ctx.issuer(gc), "ProviderName": ctx.issuer(gc), "PublisherName": ctx.issuer(gc),
        "PricingCategory": _PRICING_CATEGORY.get(t.ownership, "Other"),
        "RegionId": t.site, "RegionName": t.site, "ResourceId": t.uuid,
        "ResourceName": f"{t.node}/{t.uuid}" if t.node else t.uuid, "ResourceType": "GPU",
        "ServiceCategory": "Compute", "ServiceName": "GPU compute", "SkuId": f"{t.model}-{t.ownership}",
        "x_GpuUuid": t.uuid, "x_GpuModel": t.model, "x_Ownership": t.ownership, "x_Pool": t.pool,
        "ServiceProviderName": ctx.issuer(gc), "HostProviderName": ctx.issuer(gc), **_commitment(gc),
    }


def commitment_id(gc: GpuCost) -> str | None:
    """The contract commitment a leased GPU's charges count towards: its lease contract."""
    t = gc.terms
    return None if t.ownership != "leased" else (t.lease_contract or f"lease-{t.uuid}")


def _commitment(gc: GpuCost) -> Row:
    cid = commitment_id(gc)
    if cid is None:
        return {"CommitmentDiscountCategory": None, "CommitmentDiscountId": None, "CommitmentDiscountName": None,
                "CommitmentDiscountStatus": None, "CommitmentDiscountType": None, "ContractApplied": None}
    return {"CommitmentDiscountCategory": "Usage", "CommitmentDiscountId": cid,
            "CommitmentDiscountName": f"{gc.terms.lease_provider or 'lessor'} {cid}",
            "CommitmentDiscountStatus": None, "CommitmentDiscountType": "GPU lease", "ContractApplied": None}


def _applied(gc: GpuCost, cost: Decimal, quantity: Decimal | None, unit: str | None) -> Row:
    """The commitment fields of a leased GPU's row: status set by the caller, the contract applied."""
    cid = commitment_id(gc)
    if cid is None:
        return {}
    return {"ContractApplied": {"Elements": [{"ContractCommitmentId": cid, "ContractCommitmentAppliedCost": cost,
                                              "ContractCommitmentAppliedQuantity": quantity,
                                              "ContractCommitmentAppliedUnit": unit}]}}


def _usage(ctx: FocusContext, gc: GpuCost, start_ms: int, end_ms: int, ms: int, rate: Decimal,
           list_rate: Decimal | None, cost: Decimal, description: str, job: JobInfo | None) -> Row:
    hours = _q(Decimal(ms) / MS_PER_HOUR)
    unit = _q(rate * MS_PER_HOUR)
    billed = cost if gc.terms.ownership in ("cloud", "unknown") else Decimal(0)
    lst = list_rate if list_rate is not None else unit
    tags = {} if job is None else {"team": job.team, "project": job.project, "job": job.job_id}
    return {
        **_base(ctx, gc, start_ms, end_ms), "ChargeCategory": "Usage", "ChargeFrequency": "Usage-Based",
        "ChargeDescription": description, "BilledCost": billed, "EffectiveCost": cost,
        "ContractedUnitPrice": unit, "ContractedCost": cost, "ListUnitPrice": lst, "ListCost": _q(lst * hours),
        "PricingQuantity": hours, "PricingUnit": "GPU-Hours", "ConsumedQuantity": hours, "ConsumedUnit": "GPU-Hours",
        "Tags": tags, "x_Team": job.team if job else None, "x_Project": job.project if job else None,
        "x_JobId": job.job_id if job else None, "x_Attempt": job.attempt if job else None, "x_Idle": job is None,
        **({"CommitmentDiscountStatus": "Used" if job else "Unused", **_applied(gc, cost, hours, "GPU-Hours")}
           if commitment_id(gc) else {}),
    }


def _power(ctx: FocusContext, gc: GpuCost, month: datetime, window: tuple[int, int], kwh: Decimal, cost: Decimal,
           job: JobInfo | None) -> Row:
    start = max(to_ms(month), window[0])
    end = min(to_ms(next_month(month)), window[1])
    tags = {} if job is None else {"team": job.team, "project": job.project, "job": job.job_id}
    price = _q(cost / kwh) if kwh else Decimal(0)
    return {
        **_base(ctx, gc, start, end), "ChargeCategory": "Usage", "ChargeFrequency": "Usage-Based",
        "ChargeDescription": f"power for {gc.terms.model} {'while idle' if job is None else 'job ' + job.job_id}",
        "BilledCost": cost, "EffectiveCost": cost, "ContractedUnitPrice": price, "ContractedCost": cost,
        "ListUnitPrice": price, "ListCost": cost, "PricingQuantity": _q(kwh), "PricingUnit": "kWh",
        "ConsumedQuantity": _q(kwh), "ConsumedUnit": "kWh", "Tags": tags, "SkuId": f"{gc.terms.model}-power",
        "x_Team": job.team if job else None, "x_Project": job.project if job else None,
        "x_JobId": job.job_id if job else None, "x_Attempt": job.attempt if job else None, "x_Idle": job is None,
    }


def _lease_purchases(ctx: FocusContext, gc: GpuCost, start_ms: int, end_ms: int) -> list[Row]:
    """One recurring purchase row per calendar month of the lease term that overlaps the window."""
    t = gc.terms
    if t.ownership != "leased" or not gc.segments:
        return []
    if t.lease_start:
        term_start, term_end = (to_ms(x) for x in lease_term(t.lease_start, t.lease_end, t.minimum_term_months))
    else:
        term_start, term_end = gc.segments[0].start_ms, gc.segments[-1].end_ms
    rows = []
    m = month_start(from_ms(max(start_ms, term_start)))
    while to_ms(m) < min(end_ms, term_end):
        lo = max(to_ms(m), term_start, start_ms)
        hi = min(to_ms(next_month(m)), term_end, end_ms)
        month_ms = to_ms(next_month(m)) - to_ms(m)
        fee = gc.segments[0].usd_per_ms * month_ms  # the lease's monthly price
        fee = next((s.usd_per_ms * month_ms for s in gc.segments if s.start_ms <= lo < s.end_ms), fee)
        qty = _q(Decimal(hi - lo) / Decimal(month_ms))
        billed = _q(fee * Decimal(hi - lo) / Decimal(month_ms))  # exact, not the rounded quantity
        rows.append({
            **_base(ctx, gc, lo, hi), "ChargeCategory": "Purchase", "ChargeFrequency": "Recurring",
            "ChargeDescription": f"lease {t.lease_contract or ''} {t.model} GPU, {m:%B %Y}".replace("  ", " "),
            "BilledCost": billed, "EffectiveCost": Decimal(0), "ContractedUnitPrice": _q(fee), "ContractedCost": billed,
            "ListUnitPrice": _q(fee), "ListCost": billed, "PricingQuantity": qty, "PricingUnit": "GPU-Months",
            "ConsumedQuantity": None, "ConsumedUnit": None, "Tags": {}, "x_Team": None, "x_Project": None,
            "x_JobId": None, "x_Attempt": None, "x_Idle": False, **_applied(gc, billed, qty, "GPU-Months"),
        })
        m = next_month(m)
    return rows


_Seg = tuple[str, int]  # (GPU uuid, segment index)


def _job_usage_rows(ctx: FocusContext, intervals: list[Interval], jobs: Mapping[str, JobInfo],
                    gpus: dict[str, GpuCost], start_ms: int,
                    end_ms: int) -> tuple[list[Row], dict[_Seg, Decimal], dict[_Seg, int]]:
    """Usage rows per job attempt, GPU and segment; the allocated cost and ms per (GPU, segment)."""
    rows: list[Row] = []
    used: dict[_Seg, Decimal] = defaultdict(Decimal)
    used_ms: dict[_Seg, int] = defaultdict(int)
    for iv in sorted(intervals, key=lambda i: (i.gpu, i.start_ms, i.job)):
        s, e = max(iv.start_ms, start_ms), min(iv.end_ms, end_ms)
        if e <= s:
            continue
        gc = gpus[iv.gpu]
        for k, seg in enumerate(gc.segments):
            lo, hi = max(s, seg.start_ms), min(e, seg.end_ms)
            if hi <= lo:
                continue
            cost = _q((hi - lo) * seg.usd_per_ms)
            used[(iv.gpu, k)] += cost
            used_ms[(iv.gpu, k)] += hi - lo
            job = jobs[iv.job]
            rows.append(_usage(ctx, gc, lo, hi, hi - lo, seg.usd_per_ms, seg.list_usd_per_hour, cost,
                               f"{job.model} GPU for job {job.job_id} attempt {job.attempt}", job))
    return rows, used, used_ms


def _idle_rows(ctx: FocusContext, gpus: dict[str, GpuCost], start_ms: int, end_ms: int, used: dict[_Seg, Decimal],
               used_ms: dict[_Seg, int]) -> list[Row]:
    """Idle usage rows per GPU and segment, and each leased GPU's monthly fee rows."""
    rows: list[Row] = []
    for uuid, gc in sorted(gpus.items()):
        if gc.usage_only:
            continue
        for k, seg in enumerate(gc.segments):
            lo, hi = max(start_ms, seg.start_ms), min(end_ms, seg.end_ms)
            if hi <= lo:
                continue
            idle = _q((hi - lo) * seg.usd_per_ms) - used[(uuid, k)]
            idle_ms = hi - lo - used_ms[(uuid, k)]
            if idle == 0 and idle_ms <= 0:
                continue
            rows.append(_usage(ctx, gc, lo, hi, max(idle_ms, 0), seg.usd_per_ms, seg.list_usd_per_hour, idle,
                               f"idle {gc.terms.model} GPU ({gc.terms.ownership}, pool {gc.terms.pool})", None))
        rows.extend(_lease_purchases(ctx, gc, start_ms, end_ms))
    return rows


def _power_rows(ctx: FocusContext, jobs: Mapping[str, JobInfo], gpus: dict[str, GpuCost], start_ms: int,
                end_ms: int, energy: Iterable[EnergyUse], prices: dict[tuple[str, int], Decimal]) -> list[Row]:
    """Power usage rows per job attempt (or idle), GPU and month."""
    power: dict[tuple[str, str | None, datetime], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for use in energy:
        price = prices.get((use.gpu, use.start_ms))
        if price is None or use.gpu not in gpus or not start_ms <= use.start_ms < end_ms:
            continue
        month = month_start(from_ms(use.start_ms))
        total = _q(Decimal(repr(use.total_j)) * price / J_PER_KWH)
        spent, joules = Decimal(0), Decimal(0)
        for job, j in use.by_job:
            if job not in jobs:
                continue
            c = _q(Decimal(repr(j)) * price / J_PER_KWH)
            acc = power[(use.gpu, job, month)]
            acc[0] += Decimal(repr(j)) / J_PER_KWH
            acc[1] += c
            spent += c
            joules += Decimal(repr(j))
        acc = power[(use.gpu, None, month)]
        acc[0] += (Decimal(repr(use.total_j)) - joules) / J_PER_KWH
        acc[1] += total - spent
    rows = []
    for (gpu, who, month), (kwh, cost) in sorted(power.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
        if cost == 0 and kwh <= 0:
            continue
        rows.append(_power(ctx, gpus[gpu], month, (start_ms, end_ms), kwh, cost, jobs.get(who) if who else None))
    return rows


def focus_rows(
    intervals: list[Interval], jobs: Mapping[str, JobInfo], gpus: dict[str, GpuCost], start_ms: int, end_ms: int,
    energy: Iterable[EnergyUse] = (), kwh_price: dict[tuple[str, int], Decimal] | None = None,
    ctx: FocusContext | None = None, share_idle_by: str | None = None,
) -> list[Row]:
    """FOCUS 1.3 cost and usage rows for [start_ms, end_ms); values are Decimals, strings, dicts (JSON) or None.

    `share_idle_by` ("team" or "project"): every idle row becomes split cost allocated rows, one per team (or
    project) that used its pool and model in the window, in proportion to their GPU-hours there."""
    ctx = ctx or FocusContext()
    rows, used, used_ms = _job_usage_rows(ctx, intervals, jobs, gpus, start_ms, end_ms)
    rows += _idle_rows(ctx, gpus, start_ms, end_ms, used, used_ms)
    rows += _power_rows(ctx, jobs, gpus, start_ms, end_ms, energy, kwh_price or {})
    rows = [{**UNALLOCATED, **r} for r in rows]
    return split_idle(rows, share_idle_by) if share_idle_by else rows


def focus_csv(rows: list[Row], columns: list[str] | None = None) -> str:
    """FOCUS rows as CSV: Decimals plain, JSON columns as JSON objects, nulls empty."""
    columns = columns or FOCUS_COLUMNS
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _cell(r.get(k)) for k in columns})
    return buf.getvalue()


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True, default=lambda d: float(d) if isinstance(d, Decimal) else str(d))
    return str(v)


def jobs_csv(cb: Chargeback) -> str:
    """One line per job attempt, then one idle line per pool and model; amounts exact to 1e-6 USD."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["kind", "job_id", "attempt", "team", "project", "model", "pool", "gpu_hours", "fixed_usd", "power_usd",
                "cost_usd", "efficiency_pct"])
    for key in sorted(cb.jobs):
        j = cb.jobs[key]
        w.writerow(["job", j.info.job_id, j.info.attempt, j.info.team, j.info.project, j.info.model, "",
                    format(_q(Decimal(j.gpu_ms) / MS_PER_HOUR), "f"), format(j.fixed_usd, "f"),
                    format(j.power_usd, "f"), format(j.usd, "f"),
                    "" if j.util_mean is None else f"{j.util_mean:.1f}"])
    for (pool, model), g in sorted(cb.groups.items()):
        w.writerow(["idle", "", "", "", "", model, pool,
                    format(_q(Decimal(g.capacity_ms - g.allocated_ms) / MS_PER_HOUR), "f"), "", "",
                    format(g.idle_usd, "f"), ""])
    return buf.getvalue()
