"""The shell every WhaleFlux service runs in.

A service subclasses `ServiceBase`, names its consumers and routes, and keeps
its decisions in plain modules. The shell owns the rest: NATS and Redis
connections (retried until reachable), stream and consumer declarations,
`/healthz`, `/readyz`, `/metrics`, bearer-token admin endpoints, JSON logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Annotated

import structlog
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
import nats.errors
from nats.js.errors import NotFoundError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .apidocs import mount_api_docs
from .bus import Bus, BusMetrics, Handler, Retry, batch_handler, is_batch_handler
from .logs import configure_logging
from .outbox import Outbox
from .settings import CommonSettings
from .streams import CONSUMERS, ConsumerSpec

Clock = Callable[[], datetime]
# How often a running service checks that its state is still there, and how long a rebuilding
# replica's claim lasts if it dies mid-rebuild.
STATE_CHECK_S = 0.5
STATE_CHECK_TIMEOUT_S = 2.0
REBUILD_CLAIM_MS = 300_000


class StateUnavailable(Exception):
    """The state store is unreachable, or lost and being rebuilt: nothing can be decided now."""


def system_clock() -> datetime:
    return datetime.now(timezone.utc)


_bearer = HTTPBearer(auto_error=False)


class ServiceBase:
    """Subclass and set `name`; override `consumers`, `add_routes`, `on_ready`, `background`."""

    name: str = "service"
    version: str = "0.1.0"

    def __init__(self, settings: CommonSettings, clock: Clock = system_clock):
        self.settings = settings
        self.clock = clock
        self.registry = CollectorRegistry()
        self.bus_metrics = BusMetrics.create(self.registry)
        self.log = structlog.get_logger(f"whaleflux.{self.name}")
        self.bus: Bus | None = None
        self.redis: Redis | None = None
        self.outbox: Outbox | None = None
        self._tasks: list[asyncio.Task] = []
        # Set while the state store is reachable and whole; consumers fetch only then.
        self.state_ready = asyncio.Event()
        self.state_problem: str | None = "starting"
        self.epoch: str | None = None
        self._starting = False  # the lifespan began connecting (an app served without it never connects)
        self._running = False

    # ----------------------------------------------------------------- to override

    @property
    def prefix(self) -> str:
        """Redis key prefix: each service keeps its state under its own."""
        return f"wf:{self.name}"

    def consumers(self) -> dict[str, Handler]:
        """Durable consumer name (from streams.CONSUMERS) -> handler."""
        return {}

    def consumer_specs(self) -> dict[str, ConsumerSpec]:
        return {name: CONSUMERS[name] for name in self.consumers()}

    def add_routes(self, app: FastAPI, admin: Callable) -> None:
        """Add this service's HTTP API; `admin` is the dependency that requires the bearer token."""

    async def on_ready(self) -> None:
        """Called once NATS, Redis and the streams are ready, before consumers start."""

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        """Long-running loops started after `on_ready`; each must survive its own errors."""
        return []

    async def metrics_text(self) -> bytes:
        """The /metrics body; a service appends families prometheus_client cannot write (e.g. DCGM counters)."""
        return generate_latest(self.registry)

    # ----------------------------------------------------------------- plumbing

    async def _connect(self) -> None:
        delay = 0.2
        while True:
            try:
                if self.redis is None:
                    redis = Redis.from_url(
                        self.settings.redis_url,
                        password=self.settings.secret("redis_password"),
                        decode_responses=True,
                        health_check_interval=10,
                    )
                    await redis.ping()
                    self.redis = redis
                if self.bus is None:
                    self.bus = await Bus.connect(
                        self.settings.nats_url,
                        source=f"whaleflux/{self.name}/{self.settings.instance}",
                        user=self.settings.nats_user,
                        password=self.settings.secret("nats_password"),
                        metrics=self.bus_metrics,
                    )
                await self.bus.ensure_streams()
                return
            except Exception as exc:
                self.log.warning("startup.waiting", error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _start(self) -> None:
        await self._connect()
        self.outbox = Outbox(self.redis, self.prefix)
        delay = 0.5
        while True:
            # A failure here (the store went away between connect and now, say) must not leave a
            # service that never becomes ready: nothing has started yet, so it is tried again.
            try:
                await self.on_ready()
                await self._ensure_state()
                break
            except (RedisError, OSError, nats.errors.Error, StateUnavailable) as exc:
                self.log.error("startup.failed", error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        specs = self.consumer_specs()
        for name, handler in self.consumers().items():
            self.bus.start_consumer(specs[name], self._store_guarded(handler), self.redis, self.prefix, self.state_ready)
        for loop in [*self.background(), self._outbox_loop, self._state_watch]:
            self._tasks.append(asyncio.create_task(self._guard(loop), name=loop.__name__))
        self._running = True
        self.log.info("service.started", consumers=sorted(specs))

    # ----------------------------------------------------------------- state guard

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}:state-epoch"

    async def _ensure_state(self) -> None:
        """Rebuild when Redis holds none of this service's state (first start, wiped, or replaced).

        The epoch marker names the state this process works on. While another replica
        rebuilds (marker `rebuilding:…`, with a TTL in case it dies), wait for it.
        """
        while True:
            current = await self.redis.get(self.epoch_key)
            if current is not None and not current.startswith("rebuilding:"):
                self.epoch = current
                self._state_up()
                return
            if current is None:
                mine = uuid.uuid4().hex
                if await self.redis.set(self.epoch_key, f"rebuilding:{mine}", nx=True, px=REBUILD_CLAIM_MS):
                    self.log.warning("state.rebuilding", reason=self.state_problem)
                    started = time.perf_counter()
                    await self.rebuild_state()
                    await self.redis.set(self.epoch_key, mine)
                    self.log.warning("state.rebuilt", seconds=round(time.perf_counter() - started, 2))
                    continue
            await asyncio.sleep(0.2)

    async def rebuild_state(self) -> None:
        """Rebuild this service's Redis state from JetStream (called with consumers paused).

        Default: the history consumers are deleted, so they are created again at the start
        of their streams and replay them (handlers are idempotent, and their dedup markers
        went with the state), then `on_ready` reloads what it keeps in memory.
        """
        for name, spec in self.consumer_specs().items():
            if spec.deliver_new:
                continue  # live feeds have nothing to rebuild from
            try:
                await self.bus.js.delete_consumer(spec.stream, name)
                self.log.warning("state.replaying", consumer=name, stream=spec.stream)
            except NotFoundError:
                pass  # never created: a first start
        if self._running:  # lost while running: what on_ready keeps in memory is stale
            await self.on_ready()

    def _state_up(self) -> None:
        if not self.state_ready.is_set():
            self.log.warning("state.ready", after=self.state_problem)
        self.state_problem = None
        self.state_ready.set()

    def _state_down(self, problem: str) -> None:
        """Stop deciding: consumers pause, the API answers 503 with `problem`."""
        if self.state_ready.is_set():
            self.log.error("state.unavailable", problem=problem, note="consumers paused; nothing decided until it is back")
        self.state_problem = problem
        self.state_ready.clear()

    def require_state(self) -> None:
        """Raise StateUnavailable unless the state store is reachable and whole."""
        if not self.state_ready.is_set():
            raise StateUnavailable(self.state_problem or "state store not ready")

    async def _state_watch(self) -> None:
        """Notice a lost or unreachable store while running, not only at start-up."""
        while True:
            await asyncio.sleep(STATE_CHECK_S)
            try:
                current = await asyncio.wait_for(self.redis.get(self.epoch_key), STATE_CHECK_TIMEOUT_S)
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                self._state_down(f"state store unreachable ({type(exc).__name__})")
                continue
            if current == self.epoch:
                self._state_up()
                continue
            self._state_down("state lost (the store was wiped or replaced); rebuilding from JetStream")
            try:
                await self._ensure_state()
            except (RedisError, OSError) as exc:
                self.log.warning("state.rebuild_interrupted", error=repr(exc))

    def _store_guarded(self, handler: Handler) -> Handler:
        """A handler that hits an unreachable store pauses the consumers and asks for a redelivery."""

        async def guarded(*args):
            try:
                return await handler(*args)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self._state_down(f"state store unreachable ({type(exc).__name__})")
                raise Retry(f"state store unreachable: {exc}", delay_s=2.0) from exc
            except StateUnavailable as exc:
                self._state_down(str(exc))
                raise Retry(str(exc), delay_s=2.0) from exc

        if is_batch_handler(handler):
            guarded = batch_handler(guarded)
        return guarded

    async def _outbox_loop(self) -> None:
        """Publish what a failed or interrupted flush left behind."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.publish_staged()
            except Exception as exc:
                self.log.warning("outbox.flush_failed", error=repr(exc))

    async def _guard(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Restart a background loop that raised, after a pause; never let it die."""
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.error("background.crashed", loop=loop.__name__, error=repr(exc))
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.bus is not None:
            await self.bus.close()
        if self.redis is not None:
            await self.redis.aclose()

    async def publish_staged(self) -> None:
        """Publish what the outbox holds (call after executing a pipeline that staged events)."""
        await self.outbox.flush(self.bus)

    async def readiness(self) -> dict:
        checks: dict[str, bool] = {"nats": bool(self.bus and self.bus.connected), "redis": False,
                                   "state": self.state_ready.is_set()}
        if self.redis is not None:
            try:
                checks["redis"] = bool(await asyncio.wait_for(self.redis.ping(), 1.0))
            except Exception:
                checks["redis"] = False
        bound = self.bus.bound if self.bus else set()
        for name in self.consumer_specs():
            checks[f"consumer:{name}"] = name in bound
        return checks

    def require_admin(self) -> Callable:
        expected = self.settings.secret("admin_token") or ""

        async def dependency(
            credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        ) -> None:
            if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
                raise HTTPException(
                    status_code=401,
                    detail="admin endpoint: missing or wrong bearer token (Authorization: Bearer <token>)",
                    headers={"WWW-Authenticate": "Bearer"},
                )

        return dependency

    def create_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self._starting = True
            starter = asyncio.create_task(self._start(), name="startup")
            self._tasks.append(starter)
            yield
            await self.stop()

        # /docs and /redoc from vendored assets (apidocs.py): FastAPI's defaults need a CDN.
        app = FastAPI(title=f"WhaleFlux {self.name}", version=self.version, lifespan=lifespan,
                      docs_url=None, redoc_url=None)
        mount_api_docs(app)

        @app.middleware("http")
        async def not_before_connected(request: Request, call_next):
            # The port may be bound (and asked) before the service has reached its store: say so.
            if self._starting and self.redis is None and request.url.path.startswith(("/v1/", "/admin/")):
                return JSONResponse({"detail": f"{self.name} is starting: not connected to its store yet"},
                                    status_code=503, headers={"Retry-After": "1"})
            return await call_next(request)
        admin = self.require_admin()
        AdminDep = Depends(admin)

        @app.get("/healthz", tags=["ops"])
        async def healthz() -> dict:
            """Alive: the process answers."""
            return {"status": "ok", "service": self.name}

        @app.get("/readyz", tags=["ops"])
        async def readyz() -> Response:
            """Ready: NATS and Redis reachable and every consumer bound."""
            checks = await self.readiness()
            ok = all(checks.values())
            return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

        @app.get("/metrics", tags=["ops"])
        async def metrics() -> Response:
            return Response(await self.metrics_text(), media_type=CONTENT_TYPE_LATEST)

        @app.get("/admin/status", tags=["admin"], dependencies=[AdminDep])
        async def admin_status() -> dict:
            """Consumer positions and settings (secrets masked)."""
            consumers = {}
            if self.bus is not None:
                for name, spec in self.consumer_specs().items():
                    try:
                        info = await self.bus.js.consumer_info(spec.stream, name)
                        consumers[name] = {
                            "pending": info.num_pending,
                            "ack_pending": info.num_ack_pending,
                            "redelivered": info.num_redelivered,
                        }
                    except Exception as exc:
                        consumers[name] = {"error": type(exc).__name__}
            return {"service": self.name, "consumers": consumers, "settings": self.settings.redacted()}

        @app.exception_handler(StateUnavailable)
        async def state_unavailable(request: Request, exc: StateUnavailable) -> JSONResponse:
            return JSONResponse({"detail": f"{self.name} cannot answer now: {exc}"}, status_code=503,
                                headers={"Retry-After": "2"})

        @app.exception_handler(RedisError)
        async def store_error(request: Request, exc: RedisError) -> JSONResponse:
            self._state_down(f"state store unreachable ({type(exc).__name__})")
            return JSONResponse({"detail": f"{self.name} cannot answer now: state store unreachable"}, status_code=503,
                                headers={"Retry-After": "2"})

        @app.exception_handler(nats.errors.Error)
        async def bus_error(request: Request, exc: nats.errors.Error) -> JSONResponse:
            return JSONResponse({"detail": f"{self.name} cannot answer now: the bus is unreachable ({type(exc).__name__})"},
                                status_code=503, headers={"Retry-After": "2"})

        @app.exception_handler(ValueError)
        async def value_error(request: Request, exc: ValueError) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status_code=400)

        self.add_routes(app, AdminDep)
        return app


def run_service(service: ServiceBase) -> None:
    """Run one service process until SIGTERM/SIGINT."""
    configure_logging(service.name, service.settings.log_level)
    uvicorn.run(
        service.create_app(),
        host=service.settings.http_host,
        port=service.settings.http_port,
        log_config=None,
        access_log=True,
        lifespan="on",
    )
