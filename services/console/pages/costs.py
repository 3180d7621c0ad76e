"""Costs: by team, project, model or pool over a window, the idle lines, budgets, exports, the TCO calculator."""

from __future__ import annotations

from datetime import date
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from ..models import Budget, CostReport, Tco
from ..upstream import UpstreamError, fetch_all
from ..web import ConsoleDep, SessionDep, page

router = APIRouter()
GROUPINGS = ["team", "project", "model", "pool", "job"]
EXPORT_TYPES = {
    "focus": ("text/csv", "focus.csv"), "csv": ("text/csv", "costs.csv"), "json": ("application/json", "costs.json"),
}


@router.get("/costs", response_class=HTMLResponse)
async def costs(request: Request, c: ConsoleDep, _: SessionDep, by: str = "team",
                from_: date | None = Query(None, alias="from"), to: date | None = None,
                share_idle: bool = False) -> Response:
    by = by if by in GROUPINGS else "team"
    window = {"from": from_.isoformat() if from_ else None, "to": to.isoformat() if to else None}
    values, errors = await fetch_all({
        "report": c.upstream.get_as(CostReport, "billing", "/v1/costs", by=by, share_idle=str(share_idle).lower(),
                                    **window),
        "budgets": c.upstream.get_as(list[Budget], "billing", "/v1/budgets"),
    })
    return page(request, "costs.html", "costs", r=values["report"], budgets=values["budgets"] or [], errors=errors,
                by=by, groupings=GROUPINGS, window=window, share_idle=share_idle,
                export_query="&".join(f"{k}={v}" for k, v in window.items() if v))


@router.get("/costs/export")
async def export(c: ConsoleDep, _: SessionDep, format: Literal["focus", "csv", "json"] = "focus",
                 from_: date | None = Query(None, alias="from"), to: date | None = None) -> Response:
    """billing's export as a download (the browser never talks to billing itself)."""
    resp = await c.upstream.raw("billing", "/v1/costs/export", format=format,
                                **{"from": from_.isoformat() if from_ else None, "to": to.isoformat() if to else None})
    media, name = EXPORT_TYPES[format]
    stamp = (from_ or date.today()).isoformat()
    return Response(resp.content, media_type=media,
                    headers={"Content-Disposition": f'attachment; filename="whaleflux-{stamp}-{name}"'})


@router.get("/costs/tco", response_class=HTMLResponse)
async def tco(request: Request, c: ConsoleDep, _: SessionDep, model: str = "H100", gpus: int = 8,
              utilization: float = 0.6, months: int = 36, purchase_price: str = "", usd_per_kwh: str = "",
              overhead: str = "", lease_monthly: str = "", cloud_hourly: str = "") -> Response:
    asked = {"model": model, "gpus": gpus, "utilization": utilization, "months": months,
             "purchase_price": purchase_price, "usd_per_kwh": usd_per_kwh, "overhead": overhead,
             "lease_monthly": lease_monthly, "cloud_hourly": cloud_hourly}
    result, error = None, None
    if "model" in request.query_params:
        try:
            result = await c.upstream.get_as(Tco, "billing", "/v1/tco", **asked)
        except UpstreamError as exc:
            error = exc.detail
    return page(request, "tco.html", "costs", asked=asked, t=result, error=error)
