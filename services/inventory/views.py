"""What the inventory API answers, in the shared contracts' models where other services read it. No I/O."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Set
from datetime import datetime
from typing import Any

from whaleflux.shared import contracts

from .findings import CapacityRow, Finding
from .leases import Lease
from .reconcile import GpuAsset
from .rollups import HourRow


def asset(a: GpuAsset) -> contracts.Asset:
    """One GPU with ownership, place and terms: what billing reads from GET /v1/assets."""
    c, p = a.contract, a.purchase
    return contracts.Asset(
        uuid=a.uuid, index=a.index, model=a.model, node=a.node, status=a.status, last_seen=a.last_seen,
        ownership=a.ownership, declared=a.declared, site=a.site, cluster=a.cluster, rack=a.rack, pool=a.pool,
        monthly_cost_usd=a.monthly_cost,
        lease=None if c is None else contracts.LeaseTerms(
            contract_id=c.id, provider=c.provider, start=c.start, end=c.end,
            monthly_price_per_gpu_usd=c.monthly_price_per_gpu, minimum_term_months=c.minimum_term_months,
            auto_renew=c.auto_renew, notice_days=c.notice_days,
        ),
        contracts=list(a.contracts),
        purchase=None if p is None else contracts.PurchaseTerms(
            price_per_gpu_usd=p.price_per_gpu, date=p.date, depreciation_months=p.depreciation_months),
        hourly_price_per_gpu_usd=a.hourly_price_per_gpu, since=a.since,
    )


def lease_row(lease: Lease, now: datetime) -> contracts.LeaseRow:
    """One contract of GET /v1/leases: its state and days left at `now`."""
    c, notice = lease.contract, lease.notice_deadline
    return contracts.LeaseRow(
        contract_id=c.id, provider=c.provider, state=lease.state(now), start=c.start, ends_at=lease.term_end,
        covered_through=lease.covered_through, notice_by=lease.notice_by,
        days_left=round((lease.term_end - now).total_seconds() / 86400, 2), notice_deadline=notice,
        notice_days_left=round((notice - now).total_seconds() / 86400, 2) if notice else None,
        auto_renew=c.auto_renew, minimum_term_months=c.minimum_term_months, renewed_by=lease.renewed_by,
        gpu_count=lease.gpu_count, nodes=list(lease.nodes), gpu_models=list(lease.models),
        monthly_price_per_gpu_usd=c.monthly_price_per_gpu, monthly_cost_usd=lease.monthly_cost,
    )


def finding(f: Finding) -> contracts.Finding:
    return contracts.Finding(kind=f.kind, severity=f.severity, summary=f.summary, monthly_usd=f.monthly_usd,
                             gpus=list(f.gpus), detail=f.detail)


def finding_json(f: Finding) -> dict[str, Any]:
    """A finding as GET /v1/findings writes it."""
    return finding(f).model_dump(mode="json")


def hour_json(r: HourRow) -> dict[str, Any]:
    return {"key": r.key, "hour": r.hour.isoformat(), "gpus": r.gpus, "allocated_s": round(r.allocated_s, 6),
            "allocated_fraction": round(r.allocated_fraction, 6),
            "mean_util_allocated": None if r.mean_util_allocated is None else round(r.mean_util_allocated, 2),
            "mean_util": None if r.mean_util is None else round(r.mean_util, 2)}


def capacity_row(r: CapacityRow) -> contracts.CapacityRow:
    return contracts.CapacityRow(model=r.model, pool=r.pool, gpus=r.gpus, free=r.free, free_nodes=r.free_nodes)


def grouped(assets: list[GpuAsset], by: str, allocated: set[str], hours: list[HourRow],
            verdicts: Mapping[str, str] | None = None, quarantined: Set[str] = frozenset(),
            draining: Set[str] = frozenset()) -> list[dict[str, Any]]:
    """Count, active / missing / unhealthy (`discovery.gpu_status`), allocated now, mean utilization while allocated,
    and how many passed or failed their last burn-in (`verdicts`: uuid -> the last gpu.validated verdict), per
    model / pool / ownership."""
    verdicts = verdicts or {}
    field = {"model": "model", "pool": "pool", "ownership": "ownership"}[by]
    util: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # uuid -> [util x allocated s, allocated s]
    for r in hours:
        if r.mean_util_allocated is not None and r.allocated_s > 0:
            util[r.key][0] += r.mean_util_allocated * r.allocated_s
            util[r.key][1] += r.allocated_s
    rows: dict[str, dict[str, Any]] = {}
    for a in assets:
        key = getattr(a, field)
        row = rows.setdefault(key, {"key": key, "gpus": 0, "active": 0, "missing": 0, "unhealthy": 0,
                                    "allocated": 0, "validated": 0, "quarantined": 0, "draining": 0, "free": 0,
                                    "_u": [0.0, 0.0]})
        row["gpus"] += 1
        row["validated"] += verdicts.get(a.uuid) in ("pass", "warn")
        # As `gpus list` counts them: quarantined by the scheduler (or failed its last burn-in); else on a
        # draining node; else free when active and not allocated.
        out_of_work = a.uuid in quarantined or verdicts.get(a.uuid) == "fail"
        drains = not out_of_work and f"{a.cluster}/{a.node}" in draining
        row["quarantined"] += out_of_work
        row["draining"] += drains
        row["free"] += not out_of_work and not drains and a.status == "active" and a.uuid not in allocated
        row[a.status if a.status in ("active", "unhealthy") else "missing"] += 1
        row["allocated"] += a.uuid in allocated
        row["_u"][0] += util[a.uuid][0]
        row["_u"][1] += util[a.uuid][1]
    out = []
    for key in sorted(rows):
        row = rows[key]
        weighted, secs = row.pop("_u")
        row["mean_util_allocated"] = round(weighted / secs, 2) if secs else None
        out.append(row)
    return out
