"""Inventory's HTTP API: GPUs, assets, declarations, leases, findings, capacity, rollups."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from whaleflux.shared import contracts, yamlconfig
from whaleflux.shared.deps import AdminDep, NowDep, ViewerDep
from whaleflux.shared.runtime import BadRequest

from . import views
from .assets import AssetsError
from .discovery import GpuRow
from .findings import capacity as free_capacity
from .service import Inventory


def _inventory(request: Request) -> Inventory:
    inventory: Inventory = request.app.state.inventory
    return inventory


InventoryDep = Annotated[Inventory, Depends(_inventory)]

router = APIRouter(tags=["inventory"], dependencies=[ViewerDep])
admin = APIRouter(tags=["admin"], dependencies=[AdminDep])


@router.get("/v1/gpus")
async def gpus(inv: InventoryDep, now: NowDep) -> list[GpuRow]:
    """Every GPU ever registered, with its status."""
    return await inv.gpus(now)


@router.get("/v1/summary")
async def summary(inv: InventoryDep, now: NowDep) -> list[dict[str, Any]]:
    """GPU counts by model and status."""
    counts = Counter((r.model, r.status) for r in await inv.gpus(now))
    return [{"model": m, "status": s, "gpus": c} for (m, s), c in sorted(counts.items())]


@router.get("/v1/inventory")
async def inventory(
    inv: InventoryDep,
    now: NowDep,
    by: Literal["model", "pool", "ownership"] = "model",
    hours: float = Query(24, gt=0, le=24 * 40, description="window of the mean utilization"),
) -> list[dict[str, Any]]:
    """Per model, pool or ownership: GPUs, active, missing, allocated now, mean utilization while allocated,
    validated by their last burn-in; quarantined (by the scheduler, or by a failed burn-in), draining (on a node
    that drains) and free, as `whaleflux gpus list` counts them."""
    rec = await inv.reconciliation(now)
    rows = await inv.rollups("gpu", now - timedelta(hours=hours), now, now, rec)
    quarantined, draining = await inv.kept_out()
    return views.grouped(rec.assets, by, set(await inv.holders()), rows, await inv.verdicts(), quarantined, draining)


@router.get("/v1/assets")
async def assets(inv: InventoryDep, now: NowDep) -> list[contracts.Asset]:
    """Per GPU uuid: ownership, pool, site, cluster, rack, and lease or purchase terms (money as strings)."""
    return [views.asset(a) for a in (await inv.reconciliation(now)).assets]


@router.get("/v1/declarations")
async def declared(inv: InventoryDep, now: NowDep) -> contracts.Declarations:
    """The declarations in force, where they came from, and the last rejected attempt."""
    source, applied_at = await inv.store.declaration_source()
    decl = await inv.declarations()
    rec = await inv.reconciliation(now, decl)
    return contracts.Declarations(
        source=source, applied_at=applied_at, declarations=decl.model_dump(mode="json"),
        last_error=await inv.store.declared.rejection(),
        never_seen=rec.never_seen, undeclared=rec.undeclared, mismatches=rec.mismatches,
    )


@admin.put("/admin/assets")
async def upload(request: Request, inv: InventoryDep) -> dict[str, Any]:
    """Replace the declarations with the YAML body; 422 lists every problem (line, key), nothing changes."""
    try:
        body = yamlconfig.decode_text(await request.body(), "upload", AssetsError)
        decl = await inv.apply_declarations(body, "upload")
    except AssetsError as exc:
        raise HTTPException(status_code=422, detail={"errors": exc.errors}) from None
    notices = await inv.check_leases()
    return {"applied": True, "contracts": len(decl.contracts), "assets": len(decl.assets),
            "notices_published": [n.event_id for n in notices]}


@router.get("/v1/leases")
async def lease_list(inv: InventoryDep, now: NowDep) -> list[contracts.LeaseRow]:
    """Every contract: state, days left, notice deadline, monthly cost, renewal."""
    return [views.lease_row(lease, now) for lease in sorted(await inv.leases(now), key=lambda x: x.term_end)]


@router.get("/v1/findings")
async def findings(inv: InventoryDep, now: NowDep) -> list[contracts.Finding]:
    """Idle-allocated GPUs, reserved GPUs idle for days, pools to consolidate, capacity, reconciliation."""
    return [views.finding(f) for f in await inv.all_findings(now)]


@router.get("/v1/capacity")
async def capacity(inv: InventoryDep, now: NowDep) -> list[contracts.CapacityRow]:
    """Free GPUs and whole free nodes per model and pool, now."""
    rec = await inv.reconciliation(now)
    return [views.capacity_row(r) for r in free_capacity(rec.assets, set(await inv.holders()))]


@router.get("/v1/rollups")
async def rollup_rows(
    inv: InventoryDep,
    now: NowDep,
    by: Literal["gpu", "pool"] = "pool",
    start: datetime | None = Query(None, description="default: 24 hours ago"),
    end: datetime | None = Query(None, description="default: now"),
) -> list[dict[str, Any]]:
    """Hourly allocated seconds, allocated fraction and mean utilization while allocated."""
    end = end or now
    start = start or end - timedelta(hours=24)
    if start.tzinfo is None or end.tzinfo is None:
        raise BadRequest("start/end: give a timezone (e.g. 2026-01-01T00:00:00Z)")
    if end <= start or end - start > timedelta(days=inv.settings.retention_days):
        raise BadRequest("start/end: end must be after start, within retention_days")
    return [views.hour_json(r) for r in await inv.rollups(by, start, end, now)]


ROUTERS = [router, admin]
