"""What every page shares: the console's parts, the login and CSRF checks, and rendering."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from fastapi.templating import Jinja2Templates

from whaleflux.shared.access_http import Access

from .assets import Assets
from .auth import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, Person, Session, Sessions, Signer
from .fleetstate import FleetState
from .live import LiveHub
from .settings import ConsoleSettings
from .upstream import Upstream, acting_as

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
assets = Assets(HERE / "static")
templates.env.globals.update(asset=assets.url, inline=assets.inline)

NAV = [("fleet", "/fleet", "Fleet"), ("jobs", "/jobs", "Jobs"), ("alerts", "/alerts", "Alerts"),
       ("costs", "/costs", "Costs"), ("inventory", "/inventory", "Inventory"), ("sizing", "/sizing", "Sizing")]


@dataclass
class Console:
    settings: ConsoleSettings
    upstream: Upstream
    hub: LiveHub
    signer: Signer
    fleet: FleetState
    access: Access  # who a login token is: the console's admin token, the tokens file, OIDC (as the services)
    sessions: Sessions


class NotLoggedIn(Exception):
    """No valid session: pages redirect to the login, htmx and event streams get 401."""


class BadCsrf(Exception):
    """A form or htmx request without this session's CSRF token."""


def console(request: Request) -> Console:
    return request.app.state.console


async def session(request: Request) -> Session:
    """The request's session; from here on the console calls the services with that person's credential
    (async on purpose: a dependency run in a thread could not set `acting_as` for the route)."""
    c = console(request)
    found = c.signer.session(request.cookies.get(SESSION_COOKIE))
    person = c.sessions.person(found) if found is not None else None
    if found is None or person is None:
        raise NotLoggedIn()
    request.state.session, request.state.person = found, person
    acting_as.set(person.credential)
    return found


async def csrf(request: Request, sess: Annotated[Session, Depends(session)]) -> Session:
    """Every state-changing request carries the session's CSRF token (form field or htmx header)."""
    given: object = request.headers.get(CSRF_HEADER)
    if given is None and request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data")):
        given = (await request.form()).get(CSRF_FIELD)
    if not console(request).signer.csrf_ok(sess, given if isinstance(given, str) else None):
        raise BadCsrf()
    return sess


ConsoleDep = Annotated[Console, Depends(console)]
SessionDep = Annotated[Session, Depends(session)]
CsrfDep = Annotated[Session, Depends(csrf)]


def page(request: Request, template: str, active: str | None = None, status_code: int = 200,
         **ctx: Any) -> HTMLResponse:
    """Render a template with what the layout needs (navigation, the CSRF token for forms and htmx)."""
    c = console(request)
    sess: Session | None = getattr(request.state, "session", None)
    person: Person | None = getattr(request.state, "person", None)
    return templates.TemplateResponse(
        request, template,
        {"active": active, "nav": NAV, "csrf": sess.csrf(c.signer.key) if sess else "", "now": utcnow(),
         "person": person, **ctx},
        status_code=status_code,
    )


def fragment(template: str, **ctx: Any) -> str:
    """A template as a string: one render of a live view, sent to every browser watching it."""
    return templates.get_template(template).render(now=utcnow(), **ctx)


def login_url(path: str) -> str:
    return "/login?next=" + quote(path, safe="/")


def utcnow() -> datetime:
    return datetime.now(UTC)


def sse(stream) -> StreamingResponse:
    """A live view's server-sent events; not buffered by a proxy, never cached."""
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
