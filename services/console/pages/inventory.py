"""Inventory: assets by ownership (and model, pool), leases with days left and notice deadlines, findings with the
money."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ..models import Finding, InventoryGroup, Lease
from ..upstream import fetch_all
from ..web import ConsoleDep, SessionDep, page

router = APIRouter()


@router.get("/inventory", response_class=HTMLResponse)
async def inventory(request: Request, c: ConsoleDep, _: SessionDep, by: str = "ownership") -> Response:
    by = by if by in ("ownership", "model", "pool") else "ownership"
    values, errors = await fetch_all({
        "groups": c.upstream.get_as(list[InventoryGroup], "inventory", "/v1/inventory", by=by),
        "leases": c.upstream.get_as(list[Lease], "inventory", "/v1/leases"),
        "findings": c.upstream.get_as(list[Finding], "inventory", "/v1/findings"),
    })
    return page(request, "inventory.html", "inventory", by=by, groups=values["groups"] or [],
                leases=values["leases"] or [], findings=values["findings"] or [], errors=errors)
