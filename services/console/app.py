"""The console process: wiring only (settings, the upstream client, the live hub, pages, static files)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

import structlog
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from whaleflux.shared.access_http import Access
from whaleflux.shared.apidocs import mount_api_docs
from whaleflux.shared.logs import configure_logging
from whaleflux.shared.runtime_http import guard_input

from .auth import Sessions, Signer
from .fleetstate import FleetState
from .formatting import FILTERS
from .live import LiveHub
from .pages import alerts, costs, fleet, inventory, jobs, login, sizing
from .settings import ConsoleSettings
from .upstream import Upstream, UpstreamError
from .web import BadCsrf, Console, NotLoggedIn, assets, login_url, page, templates

templates.env.filters.update(FILTERS)
log = structlog.get_logger("whaleflux.console")


def create_app(settings: ConsoleSettings) -> FastAPI:
    """The console app: pages, static files, ops endpoints; the lifespan connects the live hub to the bus."""
    hub = LiveHub(settings.live_interval_s)
    upstream = Upstream(settings.service_urls(), settings.reader_token(), settings.upstream_timeout_s)
    if settings.secret("api_token") is None:
        log.warning("console.reads_as_admin", reason="no WHALEFLUX_API_TOKEN: background reads carry the admin "
                    "token; issue the console a viewer token (docs/security.md)")
    app = FastAPI(title="WhaleFlux console", version="0.1.0", lifespan=_lifespan(settings, hub, upstream),
                  docs_url=None, redoc_url=None)
    fleet_state = FleetState(upstream, stale_after_s=settings.stale_after_s)
    hub.taps.update({"gpu.telemetry.": fleet_state.on_telemetry, "job.": fleet_state.on_job})
    app.state.console = Console(settings, upstream, hub, Signer(settings.secret("admin_token") or ""), fleet_state,
                                Access("console", settings), Sessions())
    mount_api_docs(app)
    guard_input(app)  # body limit, NaN/Infinity refused, 422s that render any bytes (no 500), as on every service

    @app.get("/static/{path:path}", include_in_schema=False)
    async def static(path: str, request: Request) -> Response:
        return assets.response(path, request)

    for module in (login, fleet, jobs, alerts, costs, inventory, sizing):
        app.include_router(module.router)
    _add_ops_routes(app, hub)
    _add_error_pages(app)
    return app


def _lifespan(settings: ConsoleSettings, hub: LiveHub,
              upstream: Upstream) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(hub.connect(settings.nats_url, settings.nats_user,
                                                 settings.secret("nats_password")), name="bus"),
                 asyncio.create_task(hub.run(), name="live")]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await hub.close()
        await upstream.close()

    return lifespan


def _add_ops_routes(app: FastAPI, hub: LiveHub) -> None:
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": "console"}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> Response:
        """Ready once it hears the bus (live updates); the pages themselves work without it."""
        checks = {"nats": hub.connected}
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        watchers = sum(len(v.queues) for v in hub.views.values())
        body = ("# TYPE whaleflux_console_view_builds_total counter\n"
                f"whaleflux_console_view_builds_total {hub.renders}\n"
                "# TYPE whaleflux_console_live_views gauge\n"
                f"whaleflux_console_live_views {len(hub.views)}\n"
                "# TYPE whaleflux_console_live_streams gauge\n"
                f"whaleflux_console_live_streams {watchers}\n")
        return Response(body, media_type="text/plain; version=0.0.4")


def _add_error_pages(app: FastAPI) -> None:
    @app.exception_handler(NotLoggedIn)
    async def not_logged_in(request: Request, exc: NotLoggedIn) -> Response:
        if request.headers.get("HX-Request") or request.url.path.startswith("/live/"):
            return JSONResponse({"detail": "log in first"}, status_code=401, headers={"HX-Redirect": "/login"})
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(login_url(target), status_code=303)

    @app.exception_handler(BadCsrf)
    async def bad_csrf(request: Request, exc: BadCsrf) -> Response:
        return HTMLResponse("This form expired or did not come from the console; reload the page.", status_code=403)

    @app.exception_handler(UpstreamError)
    async def upstream_error(request: Request, exc: UpstreamError) -> Response:
        status = exc.status if exc.status in (404, 422) else 502
        return page(request, "error.html", None, status_code=status, error=exc)


def main() -> None:
    settings = ConsoleSettings()
    configure_logging("console", settings.log_level)
    # `whaleflux up` binds the port itself and hands the listening socket over (no race for the port).
    fd = os.environ.get("WHALEFLUX_HTTP_FD")
    # X-Forwarded-* (scheme, client address) are believed only from a proxy the settings say to trust, from
    # wherever it connects; otherwise not even from 127.0.0.1 (uvicorn's default), where any local user could send them.
    trusted = settings.trust_forwarded_proto
    uvicorn.run(create_app(settings), host=settings.http_host, port=settings.http_port, fd=int(fd) if fd else None,
                log_config=None, access_log=True, lifespan="on", proxy_headers=trusted, timeout_graceful_shutdown=1,
                forwarded_allow_ips="*" if trusted else None)
