"""Billing's HTTP API: costs, exports, the price book, budgets and TCO (docs/services/billing.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import TypeAdapter, ValidationError

from whaleflux.shared import yamlconfig
from whaleflux.shared.deps import AdminDep, NowDep, ViewerDep
from whaleflux.shared.errors import BadRequest

from .budgets import Budget
from .commitments import COMMITMENT_COLUMNS, commitment_rows
from .costing import kwh_prices
from .exports import FOCUS_VERSION, FocusContext, focus_csv, focus_rows, jobs_csv
from .ownership import month_start, to_ms
from .pricebook import PriceBookError, entry_json
from .report import costs_report, plain
from .service import Billing
from .tco import TcoQuery, TcoQueryError, tco, tco_input

_budgets = TypeAdapter(list[Budget])
MAX_WINDOW = timedelta(days=400)


def _billing(request: Request) -> Billing:
    billing: Billing = request.app.state.billing
    return billing


BillingDep = Annotated[Billing, Depends(_billing)]
GroupBy = Literal["job", "team", "project", "model"]
From = Annotated[datetime | None, Query(alias="from", description="default: start of this month (UTC)")]
To = Annotated[datetime | None, Query(alias="to", description="default: now")]


def window(start: datetime | None, end: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    """A report's [from, to): this month to now by default; timezone required, at most 400 days."""
    end = end or now
    start = start or month_start(end if end <= now else now)
    for name, t in (("from", start), ("to", end)):
        if t.tzinfo is None:
            raise BadRequest(f"{name}: give a timezone (e.g. 2026-01-01T00:00:00Z)")
    if end <= start:
        raise BadRequest("from/to: `to` must be after `from`")
    if end - start > MAX_WINDOW:
        raise BadRequest("from/to: at most 400 days")
    return start.astimezone(UTC), end.astimezone(UTC)


costs = APIRouter(tags=["costs"], dependencies=[ViewerDep])


@costs.get("/v1/costs")
async def costs_view(
    billing: BillingDep, now: NowDep, start: From = None, end: To = None, by: GroupBy = "team",
    share_idle: Annotated[bool, Query(description="share each pool's idle cost back in proportion to use")] = False,
    running: Annotated[bool, Query(description="attempts still running as rows (else one running_usd line)")] = False,
) -> JSONResponse:
    """Chargeback over a window: rows per job/team/project/model, idle per pool and model, the fleet total."""
    lo, hi = window(start, end, now)
    return JSONResponse(costs_report(await billing.compute(lo, hi, now), by, share_idle, running))


@costs.get("/v1/costs/jobs/{job_id}")
async def job_cost(job_id: str, billing: BillingDep) -> JSONResponse:
    """Every metered attempt of one job, with its cost."""
    records = await billing.job_records(job_id)
    if not records:
        raise HTTPException(404, f"no usage recorded for job {job_id!r}")
    return JSONResponse(records)


@costs.get("/v1/costs/export", response_model=None)
async def export(
    billing: BillingDep, now: NowDep,
    fmt: Annotated[Literal["focus", "focus-commitments", "csv", "json"], Query(alias="format")] = "focus",
    start: Annotated[datetime | None, Query(alias="from")] = None,
    end: Annotated[datetime | None, Query(alias="to")] = None, by: GroupBy = "job",
    share_idle_by: Annotated[Literal["team", "project"] | None, Query(
        description="FOCUS: idle rows become split cost allocation rows per team or project, by GPU-hours")] = None,
) -> JSONResponse | PlainTextResponse:
    """FOCUS 1.3 cost and usage CSV, the FOCUS 1.3 contract commitment CSV (the leases), a CSV of job attempts
    and idle lines, or the JSON report; FOCUS answers declare their version (`X-FOCUS-Version`)."""
    lo, hi = window(start, end, now)
    c = await billing.compute(lo, hi, now)
    if fmt == "json":
        return JSONResponse(costs_report(c, by, False))
    if fmt == "csv":
        return PlainTextResponse(jobs_csv(c.cb), media_type="text/csv")
    version = {"X-FOCUS-Version": FOCUS_VERSION}
    if fmt == "focus-commitments":
        text = focus_csv(commitment_rows(c.gpus), COMMITMENT_COLUMNS)
        return PlainTextResponse(text, media_type="text/csv", headers=version)
    ctx = FocusContext(billing.settings.billing_account_id, billing.settings.billing_account_name)
    rows = focus_rows(c.intervals, c.jobs, c.gpus, to_ms(lo), to_ms(hi), c.energy,
                      kwh_prices(c.energy, c.gpus, c.book), ctx, share_idle_by)
    return PlainTextResponse(focus_csv(rows), media_type="text/csv", headers=version)


@costs.get("/v1/tco")
async def tco_view(
    billing: BillingDep, now: NowDep, model: str, gpus: Annotated[int, Query(ge=1, le=100000)] = 8,
    utilization: Annotated[Decimal, Query(ge=0, le=1)] = Decimal("0.6"),
    months: Annotated[int, Query(ge=1, le=120)] = 36,
    purchase_price: Annotated[Decimal | None, Query(ge=0)] = None,
    depreciation_months: Annotated[int | None, Query(ge=1)] = None,
    usd_per_kwh: Annotated[Decimal | None, Query(ge=0)] = None, overhead: Annotated[Decimal | None, Query(ge=0)] = None,
    lease_monthly: Annotated[Decimal | None, Query(ge=0)] = None,
    cloud_hourly: Annotated[Decimal | None, Query(ge=0)] = None,
) -> JSONResponse:
    """Own vs lease vs cloud for a workload; prices not given come from the price book in force."""
    q = TcoQuery(model, gpus, utilization, months, purchase_price, depreciation_months, usd_per_kwh, overhead,
                 lease_monthly, cloud_hourly)
    try:
        x, sources = tco_input(q, await billing.pricebook(), now)
    except TcoQueryError as exc:
        raise BadRequest(str(exc)) from None
    return JSONResponse({**plain(tco(x)), "sources": sources})


pricebook = APIRouter(tags=["pricebook"], dependencies=[ViewerDep])


@pricebook.get("/v1/pricebook")
async def pricebook_view(billing: BillingDep) -> JSONResponse:
    """Price entries in force (the operator's, then reference values), where they came from, the last rejection."""
    book = await billing.pricebook()
    return JSONResponse({
        "source": book.source, "applied_at": await billing.store.pricebook_applied_at(),
        "entries": [entry_json(e) for e in book.entries],
        "reference": [entry_json(e) for e in book.reference],
        "last_error": await billing.store.pricebook.rejection(),
    })


@pricebook.put("/admin/pricebook", tags=["admin"], dependencies=[AdminDep])
async def pricebook_upload(request: Request, billing: BillingDep) -> dict[str, Any]:
    """Replace the price book with the YAML body; 422 lists every problem (line, key), nothing changes."""
    try:
        body = yamlconfig.decode_text(await request.body(), "upload", PriceBookError)
        book = await billing.apply_pricebook(body, "upload")
    except PriceBookError as exc:
        raise HTTPException(422, detail={"errors": exc.errors}) from None
    return {"applied": True, "entries": len(book.entries)}


budgets = APIRouter(tags=["budgets"], dependencies=[ViewerDep])


@budgets.get("/v1/budgets")
async def budgets_view(billing: BillingDep, now: NowDep) -> JSONResponse:
    """Each budget: spend to date, burn-rate and trend projections, last week against its forecast."""
    return JSONResponse(plain(await billing.budget_statuses(now)))


@budgets.put("/admin/budgets", tags=["admin"], dependencies=[AdminDep])
async def budgets_upload(billing: BillingDep, body: Annotated[list[Any], Body(...)]) -> dict[str, Any]:
    """Replace the budgets (a JSON list); 422 names the bad field."""
    try:
        parsed = _budgets.validate_python(body)
    except ValidationError as exc:
        errors = [f"[{']['.join(str(p) for p in e['loc'])}]: {e['msg']}"
                  for e in exc.errors(include_url=False, include_input=False, include_context=False)]
        raise HTTPException(422, detail={"errors": errors}) from None
    await billing.store.save_budgets(parsed)
    return {"budgets": len(parsed), "alerts_published": await billing.check_budgets()}


ROUTERS = [costs, pricebook, budgets]
