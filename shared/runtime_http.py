"""The HTTP side every service shares: ops endpoints, the admin bearer check, errors mapped to 503/400.

Used by `shared.runtime.Runtime.app`; services use the dependencies through `shared.deps`.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import nats.errors
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from .errors import BadRequest, StateUnavailable

if TYPE_CHECKING:
    from .runtime import Runtime

_bearer = HTTPBearer(auto_error=False)
RETRY_SOON = {"Retry-After": "2"}


def require_admin(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the service's admin bearer token."""
    expected = request.app.state.runtime.settings.secret("admin_token") or ""
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(
            status_code=401,
            detail="admin endpoint: missing or wrong bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )


def refuse_before_connected(app: FastAPI, runtime: Runtime) -> None:
    """The port may be bound (and asked) before the service has reached its store: say so (503)."""

    @app.middleware("http")
    async def not_before_connected(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if runtime.starting and not runtime.connected and request.url.path.startswith(("/v1/", "/admin/")):
            return JSONResponse({"detail": f"{runtime.name} is starting: not connected to its store yet"},
                                status_code=503, headers={"Retry-After": "1"})
        return await call_next(request)


def add_ops_routes(app: FastAPI, runtime: Runtime) -> None:
    """/healthz, /readyz, /metrics and /admin/status."""

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "ok", "service": runtime.name}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> Response:
        """Ready: NATS and Redis reachable and every consumer bound."""
        checks = await runtime.readiness()
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        return Response(await runtime.metrics_body(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/status", tags=["admin"], dependencies=[Depends(require_admin)])
    async def admin_status() -> dict[str, Any]:
        """Consumer positions and settings (secrets masked)."""
        return {"service": runtime.name, "consumers": await _consumer_positions(runtime),
                "settings": runtime.settings.redacted()}


async def _consumer_positions(runtime: Runtime) -> dict[str, dict[str, Any]]:
    consumers: dict[str, dict[str, Any]] = {}
    if not runtime.connected:
        return consumers
    for name, spec in runtime.consumer_specs().items():
        try:
            info = await runtime.bus.js.consumer_info(spec.stream, name)
        except (nats.errors.Error, TimeoutError) as exc:
            consumers[name] = {"error": type(exc).__name__}
            continue
        consumers[name] = {"pending": info.num_pending, "ack_pending": info.num_ack_pending,
                           "redelivered": info.num_redelivered}
    return consumers


def add_error_handlers(app: FastAPI, runtime: Runtime) -> None:
    """StateUnavailable, Redis and NATS trouble -> 503 with Retry-After; BadRequest -> 400."""

    async def state_unavailable(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": f"{runtime.name} cannot answer now: {exc}"}, status_code=503,
                            headers=RETRY_SOON)

    async def store_error(request: Request, exc: Exception) -> Response:
        runtime.state_down(f"state store unreachable ({type(exc).__name__})")
        return JSONResponse({"detail": f"{runtime.name} cannot answer now: state store unreachable"},
                            status_code=503, headers=RETRY_SOON)

    async def bus_error(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": f"{runtime.name} cannot answer now: the bus is unreachable "
                             f"({type(exc).__name__})"}, status_code=503, headers=RETRY_SOON)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    app.add_exception_handler(StateUnavailable, state_unavailable)
    app.add_exception_handler(RedisError, store_error)
    app.add_exception_handler(nats.errors.Error, bus_error)
    app.add_exception_handler(BadRequest, bad_request)
