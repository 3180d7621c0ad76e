"""The HTTP side every service shares: ops endpoints, errors mapped to 503/400, the input guard.

Used by `shared.runtime.Runtime.app`; services use the dependencies through `shared.deps`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import nats.errors
from fastapi import Depends, FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .access_http import require_role
from .errors import BadRequest, StateUnavailable

if TYPE_CHECKING:
    from .runtime import Runtime

require_admin = require_role("admin")
RETRY_SOON = {"Retry-After": "2"}


MAX_BODY_BYTES = 8 * 1024 * 1024  # any request body; configuration uploads are at most yamlconfig.MAX_BYTES


class BodyGuard:
    """ASGI middleware at every service's edge, before any route reads the body:

    - a body over `limit` bytes: 413 (by its Content-Length, or as it streams); a bad Content-Length: 400;
    - a JSON body with NaN, Infinity or a number beyond a double (1e999): 422 naming where it is
      (`body.a.0.b`; JSON itself has none of them); one nested deeper than Python's parser goes, or not
      UTF-8: 400.
    The body is read once here and handed on unchanged.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and not declared.isdigit():
            await _answer(scope, receive, send, 400, "Content-Length: not a number")
            return
        if declared is None and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        if declared is not None and int(declared) > self.limit:
            await _answer(scope, receive, send, 413, f"request body: larger than {self.limit} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.limit:
                await _answer(scope, receive, send, 413, f"request body: larger than {self.limit} bytes")
                return
            if not message.get("more_body", False):
                break
        problem = _json_problem(bytes(body)) if b"json" in headers.get(b"content-type", b"") else None
        if problem is not None:
            await _answer(scope, receive, send, problem[0], problem[1])
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class _NotANumber:
    """Where the body had NaN, Infinity or a number beyond a double (the JSON text it was)."""

    def __init__(self, text: str) -> None:
        self.text = text[:40]


def _number(text: str) -> float | _NotANumber:
    value = float(text)
    return _NotANumber(text) if math.isinf(value) else value


def _first_not_a_number(doc: Any) -> tuple[str, _NotANumber] | None:
    """The location (`body.a.0.b`) and value of the first NaN/Infinity in `doc` (walked without recursion)."""
    stack: list[tuple[str, Any]] = [("body", doc)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, _NotANumber):
            return where, node
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend(reversed([(f"{where}.{key}", value) for key, value in items]))
    return None


def _json_problem(body: bytes) -> tuple[int, str] | None:
    """(status, detail) for a JSON body no route may be given; None when it is fine or not JSON at all (the
    route's own validation says what is wrong then)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return 400, f"body: JSON must be UTF-8 (byte {exc.start} is not)"
    try:
        doc = json.loads(text, parse_constant=_NotANumber, parse_float=_number)
    except RecursionError:
        return 400, "body: JSON nested too deeply"
    except ValueError:  # not JSON: FastAPI answers it with the location
        return None
    found = _first_not_a_number(doc)
    if found is None:
        return None
    where, number = found
    return 422, f"{where}: {number.text} is not a finite number (JSON has no NaN or Infinity)"


async def _answer(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)


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
        scaled = runtime.ownership
        return {"service": runtime.name, "consumers": await _consumer_positions(runtime),
                "settings": runtime.settings.redacted(),
                # Scaled out: the units this replica runs and the replicas it sees.
                **({"units": sorted(scaled.running), "members": scaled.members} if scaled is not None else {})}


async def _consumer_positions(runtime: Runtime) -> dict[str, dict[str, Any]]:
    consumers: dict[str, dict[str, Any]] = {}
    if not runtime.connected:
        return consumers
    specs = runtime.bus.running_consumers() if runtime.ownership is not None else runtime.consumer_specs()
    for name, spec in specs.items():
        try:
            info = await runtime.bus.js.consumer_info(spec.stream, name)
        except (nats.errors.Error, TimeoutError) as exc:
            consumers[name] = {"error": type(exc).__name__}
            continue
        consumers[name] = {"pending": info.num_pending, "ack_pending": info.num_ack_pending,
                           "redelivered": info.num_redelivered}
    return consumers


def add_error_handlers(app: FastAPI, runtime: Runtime) -> None:
    """StateUnavailable, Redis and NATS trouble -> 503 with Retry-After; BadRequest -> 400; an event over the
    bus's message limit -> 413."""

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

    async def too_large(request: Request, exc: Exception) -> Response:
        # The bus's message limit (1 MB by default) is below the request body limit: a request whose event
        # would exceed it is the client's to make smaller, not a bus outage.
        return JSONResponse({"detail": "request body: too large to publish as one event (over the bus's "
                             "message limit)"}, status_code=413)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    app.add_exception_handler(StateUnavailable, state_unavailable)
    app.add_exception_handler(RedisError, store_error)
    app.add_exception_handler(nats.errors.Error, bus_error)
    app.add_exception_handler(nats.errors.MaxPayloadError, too_large)
    app.add_exception_handler(BadRequest, bad_request)


def guard_input(app: FastAPI) -> None:
    """What every WhaleFlux app puts at its edge (the services through the runtime; the agent and the console
    call it): the body guard, and 422s that render any input."""
    app.add_middleware(BodyGuard)
    app.add_exception_handler(RequestValidationError, request_invalid)


async def request_invalid(request: Request, exc: Exception) -> Response:
    """FastAPI's 422, safe for any input: bytes that are not UTF-8 are shown replaced, never a 500."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    safe = jsonable_encoder(errors, custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")[:200]})
    return JSONResponse({"detail": safe}, status_code=422)
