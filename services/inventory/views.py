"""JSON shapes of the inventory API. Money is a decimal string, never a float."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal

from .findings import CapacityRow, Finding
from .leases import Lease
from .reconcile import GpuAsset
from .rollups import HourRow


def dec(value: Decimal | None) -> str | None:
    return None if value is None else format(value, "f")


def asset_json(a: GpuAsset) -> dict:
    """One GPU with ownership, place and terms: what billing reads from GET /v1/assets."""
    c = a.contract
    return {
        "uuid": a.uuid, "index": a.index, "model": a.model, "node": a.node, "status": a.status,
        "last_seen": a.last_seen.isoformat(), "ownership": a.ownership, "declared": a.declared,
        "site": a.site, "cluster": a.cluster, "rack": a.rack, "pool": a.pool,
        "monthly_cost_usd": dec(a.monthly_cost),
        "lease": None if c is None else {
            "contract_id": c.id, "provider": c.provider, "start": c.start.isoformat(), "end": c.end.isoformat(),
            "monthly_price_per_gpu_usd": dec(c.monthly_price_per_gpu), "minimum_term_months": c.minimum_term_months,
            "auto_renew": c.auto_renew, "notice_days": c.notice_days,
        },
        "contracts": list(a.contracts),
        "purchase": None if a.purchase is None else {
            "price_per_gpu_usd": dec(a.purchase.price_per_gpu), "date": a.purchase.date.isoformat(),
            "depreciation_months": a.purchase.depreciation_months,
        },
        "hourly_price_per_gpu_usd": dec(a.hourly_price_per_gpu),
    }


def lease_json(lease: Lease, now: datetime) -> dict:
    c = lease.contract
    return {
        "contract_id": c.id, "provider": c.provider, "state": lease.state(now),
        "start": c.start.isoformat(), "ends_at": lease.term_end.isoformat(),
        "days_left": round((lease.term_end - now).total_seconds() / 86400, 2),
        "notice_deadline": lease.notice_deadline.isoformat() if lease.notice_deadline else None,
        "notice_days_left": round((lease.notice_deadline - now).total_seconds() / 86400, 2) if lease.notice_deadline else None,
        "auto_renew": c.auto_renew, "minimum_term_months": c.minimum_term_months, "renewed_by": lease.renewed_by,
        "gpu_count": lease.gpu_count, "nodes": list(lease.nodes), "gpu_models": list(lease.models),
        "monthly_price_per_gpu_usd": dec(c.monthly_price_per_gpu), "monthly_cost_usd": dec(lease.monthly_cost),
    }


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "severity": f.severity, "summary": f.summary, "monthly_usd": dec(f.monthly_usd),
            "gpus": list(f.gpus), "detail": f.detail}


def hour_json(r: HourRow) -> dict:
    return {"key": r.key, "hour": r.hour.isoformat(), "gpus": r.gpus, "allocated_s": round(r.allocated_s, 6),
            "allocated_fraction": round(r.allocated_fraction, 6),
            "mean_util_allocated": None if r.mean_util_allocated is None else round(r.mean_util_allocated, 2),
            "mean_util": None if r.mean_util is None else round(r.mean_util, 2)}


def capacity_json(r: CapacityRow) -> dict:
    return {"model": r.model, "pool": r.pool, "gpus": r.gpus, "free": r.free, "free_nodes": r.free_nodes}


def grouped(assets: list[GpuAsset], by: str, allocated: set[str], hours: list[HourRow]) -> list[dict]:
    """Count, allocated now and mean utilization while allocated, per model / pool / ownership."""
    field = {"model": "model", "pool": "pool", "ownership": "ownership"}[by]
    util: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # uuid -> [util x allocated s, allocated s]
    for r in hours:
        if r.mean_util_allocated is not None and r.allocated_s > 0:
            util[r.key][0] += r.mean_util_allocated * r.allocated_s
            util[r.key][1] += r.allocated_s
    rows: dict[str, dict] = {}
    for a in assets:
        key = getattr(a, field)
        row = rows.setdefault(key, {"key": key, "gpus": 0, "active": 0, "missing": 0, "allocated": 0, "_u": [0.0, 0.0]})
        row["gpus"] += 1
        row["active" if a.status == "active" else "missing"] += 1
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
