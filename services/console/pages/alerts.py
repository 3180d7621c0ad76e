"""Alerts: firing alerts and incidents live, ack, silence with a duration, the notification log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from ..live import Frames
from ..models import Alert, Incident, NotificationRow, Silence
from ..upstream import UpstreamError, fetch_all
from ..web import Console, ConsoleDep, CsrfDep, SessionDep, fragment, page, sse

router = APIRouter()
DURATIONS = ["30m", "1h", "2h", "4h", "8h", "1d", "3d", "7d"]


async def alerts_view(c: Console, notice: str | None = None, error: str | None = None) -> dict:
    values, errors = await fetch_all({
        "alerts": c.upstream.get_as(list[Alert], "alerting", "/v1/alerts"),
        "incidents": c.upstream.get_as(list[Incident], "alerting", "/v1/incidents"),
        "silences": c.upstream.get_as(list[Silence], "alerting", "/v1/silences"),
        "notifications": c.upstream.get_as(list[NotificationRow], "alerting", "/v1/notifications", limit=50),
    })
    if error:
        errors.insert(0, error)
    return {"alerts": values["alerts"] or [], "incidents": [i for i in values["incidents"] or [] if i.open],
            "silences": [s for s in values["silences"] or [] if s.state != "expired"],
            "notifications": values["notifications"] or [], "errors": errors, "notice": notice,
            "durations": DURATIONS}


def _fragment(view: dict) -> str:
    # No CSRF token inside: htmx sends it as a header from the page (base.html), so one render serves every session.
    return fragment("_alerts_live.html", **view)


@router.get("/alerts", response_class=HTMLResponse)
async def alerts(request: Request, c: ConsoleDep, _: SessionDep) -> Response:
    return page(request, "alerts.html", "alerts", live=_fragment(await alerts_view(c)))


@router.get("/live/alerts")
async def alerts_live(c: ConsoleDep, _: SessionDep) -> Response:
    async def render() -> Frames:
        return [("alerts", _fragment(await alerts_view(c)))]

    return sse(c.hub.stream("alerts", {"alert"}, render))


async def _after(c: Console, action) -> Response:
    """Run a write against alerting, then answer with the refreshed section (htmx swaps it in)."""
    notice = error = None
    try:
        notice = await action()
    except UpstreamError as exc:
        error = f"alerting refused: {exc.detail}"
    c.hub.mark("alert")  # other browsers see it at their next tick
    return HTMLResponse(_fragment(await alerts_view(c, notice, error)))


@router.post("/alerts/{fingerprint}/ack")
async def ack(fingerprint: str, c: ConsoleDep, _: CsrfDep,
              by: Annotated[str, Form()] = "console", comment: Annotated[str, Form()] = "") -> Response:
    async def action() -> str:
        await c.upstream.post("alerting", f"/v1/alerts/{fingerprint}/ack",
                              {"by": by.strip() or "console", "comment": comment})
        return f"acknowledged {fingerprint}"

    return await _after(c, action)


@router.post("/silences")
async def silence(c: ConsoleDep, _: CsrfDep, matchers: Annotated[str, Form()],
                  duration: Annotated[str, Form()] = "2h", comment: Annotated[str, Form()] = "",
                  by: Annotated[str, Form()] = "console") -> Response:
    async def action() -> str:
        lines = [m.strip() for m in matchers.replace(",", "\n").splitlines() if m.strip()]
        done = await c.upstream.post("alerting", "/v1/silences", {
            "matchers": lines, "duration": duration, "created_by": by.strip() or "console",
            "comment": comment.strip() or "silenced from the console"})
        return f"silence {done['id']} for {duration}: {', '.join(lines)}"

    return await _after(c, action)


@router.post("/silences/{silence_id}/expire")
async def expire(silence_id: str, c: ConsoleDep, _: CsrfDep) -> Response:
    async def action() -> str:
        await c.upstream.post("alerting", f"/v1/silences/{silence_id}/expire", {})
        return f"silence {silence_id} expired"

    return await _after(c, action)
