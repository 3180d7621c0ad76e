"""What every WhaleFlux service runs on: connections, state guard, consumers, ops endpoints.

A service does not inherit from it; it makes one `Runtime`, hands it its parts
(consumers, routers, start-up and background functions) and serves the app:

    runtime = Runtime(name="alerting", settings=settings, clock=clock)
    app = runtime.app(ServiceParts(consumers={...}, routers=[...], on_ready=load))
    serve(app, runtime)

The runtime owns NATS and Redis (connected with retries), stream and consumer
declarations, the state-epoch guard (rebuild from JetStream when the store lost
the service's state, consumers paused meanwhile), the outbox, `/healthz`,
`/readyz`, `/metrics`, `/admin/status`, vendored `/docs`, and the errors that
map to 503 (store or bus unreachable) and 400 (`BadRequest` only), and the
input guard before every route (body limit, JSON numbers, safe 422s). See
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import structlog
import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, generate_latest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from .access_http import install_access
from .apidocs import mount_api_docs
from .bus import BatchHandler, Bus, BusMetrics, Handler, Retry, batch_handler, is_batch_handler
from .clock import Clock, system_clock
from .errors import BadRequest, StateUnavailable
from .events import Envelope, EventData, make_envelope
from .logs import configure_logging
from .outbox_store import Outbox
from .ownership import Ownership, service_units
from .partition_store import PartitionStore
from .redis_client import StateConnection
from .runtime_http import add_error_handlers, add_ops_routes, guard_input, refuse_before_connected
from .settings import CommonSettings
from .state_guard import StateGuard
from .state_store import EpochStore
from .streams import CONSUMERS, ConsumerSpec
from .version import __version__

Loop = Callable[[], Awaitable[None]]
__all__ = ["BadRequest", "Clock", "Runtime", "ServiceParts", "StateUnavailable", "serve", "system_clock"]
# What a failed start-up step may raise and still be retried (anything else is a bug).
_STARTUP_TROUBLE = (RedisError, OSError, nats.errors.Error)
# How long `Runtime.stop` waits for its cancelled background tasks (each should end at once), and again for the
# bus's consumers: a service stops within a few seconds (`whaleflux up` kills one still running after 4 s).
STOP_TIMEOUT_S = 1.5
# How long uvicorn waits for open HTTP connections (a console's live feed, a long poll) before it closes them.
GRACEFUL_SHUTDOWN_S = 1


@dataclass
class ServiceParts:
    """What a service hands its runtime; every part is optional."""

    # Durable consumer name (shared.streams.CONSUMERS) -> handler (or `@batch_handler`).
    consumers: Mapping[str, Handler | BatchHandler] = field(default_factory=dict)
    routers: Sequence[APIRouter] = ()
    # After connect, before consumers start: load what the service keeps in memory.
    on_ready: Loop | None = None
    # Long-running loops, restarted after a pause if they raise.
    background: Sequence[Loop] = ()
    # Rebuild the Redis state from JetStream; None: replay the history consumers (see `replay_history`).
    rebuild: Loop | None = None
    # Extra /metrics body after the registry's (families prometheus_client cannot write).
    metrics_text: Callable[[], Awaitable[bytes]] | None = None
    # Put on `app.state.<key>` for the routers' dependencies.
    state: Mapping[str, object] = field(default_factory=dict)
    # Added beyond the first cut, for services with more to say:
    on_stop: Loop | None = None  # before the connections close (release a lease, close a client)
    publish: Loop | None = None  # replaces the outbox flush (e.g. only a leader publishes)
    # Adjusts the /readyz checks (e.g. a standby binds no consumers).
    readiness: Callable[[dict[str, bool]], Awaitable[dict[str, bool]]] | None = None
    exception_handlers: Mapping[type[Exception], Callable[[Request, Any], Awaitable[Response]]] = field(
        default_factory=dict)


class Runtime:
    """One service process's connections and lifecycle (see the module docstring)."""

    def __init__(self, name: str, settings: CommonSettings, clock: Clock = system_clock, version: str = __version__):
        self.name = name
        self.settings = settings
        self.clock = clock
        self.version = version
        self.registry = CollectorRegistry()
        self.bus_metrics = BusMetrics.create(self.registry)
        self.log = structlog.get_logger(f"whaleflux.{name}")
        self.parts = ServiceParts()
        self._redis: Redis | None = None
        self._state: StateConnection | None = None
        self._bus: Bus | None = None
        self._outbox: Outbox | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.stop_timeout_s = STOP_TIMEOUT_S  # how long `stop` waits for its cancelled tasks to end
        # Whether the state store is reachable and whole; consumers fetch only then.
        self.guard = StateGuard(self.log, self._rebuild)
        self.ownership: Ownership | None = None  # scaled out: the units this replica runs
        self.starting = False  # the lifespan began connecting (an app served without it never connects)
        self.running = False

    # ------------------------------------------------------------------ what services use

    @property
    def prefix(self) -> str:
        """Redis key prefix: each service keeps its state under its own."""
        return f"wf:{self.name}"

    @property
    def source(self) -> str:
        """The CloudEvents `source` of what this process publishes."""
        return f"whaleflux/{self.name}/{self.settings.instance}"

    @property
    def connected(self) -> bool:
        """Redis and NATS are connected (the state may still be rebuilding)."""
        return self._redis is not None and self._bus is not None

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            raise StateUnavailable(f"{self.name} is not connected to its store yet")
        return self._redis

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise StateUnavailable(f"{self.name} is not connected to the bus yet")
        return self._bus

    @property
    def outbox(self) -> Outbox:
        if self._outbox is None:
            raise StateUnavailable(f"{self.name} is not connected to its store yet")
        return self._outbox

    def envelope(self, data: EventData, *, subject: str | None = None, event_id: str | None = None,
                 correlation_id: str | None = None) -> Envelope:
        """A new envelope from this process, timed by the runtime's clock."""
        return make_envelope(data, source=self.source, subject=subject, event_id=event_id,
                             correlation_id=correlation_id, time=self.clock())

    async def publish_staged(self) -> None:
        """Publish what the outbox holds (call after executing a pipeline that staged events)."""
        if self.parts.publish is not None:
            await self.parts.publish()
        else:
            await self.outbox.flush(self.bus)

    @property
    def state_ready(self) -> asyncio.Event:
        """Set while the state store is reachable and whole."""
        return self.guard.ready

    @property
    def state_problem(self) -> str | None:
        return self.guard.problem

    @property
    def epoch(self) -> str | None:
        """The state generation this process works on (the state-epoch marker)."""
        return self.guard.epoch

    def require_state(self) -> None:
        """Raise StateUnavailable unless the state store is reachable and whole."""
        self.guard.require()

    def state_down(self, problem: str) -> None:
        """Stop deciding: consumers pause, the API answers 503 with `problem`."""
        self.guard.down(problem)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coro` as a task the runtime cancels at stop."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    def consumer_specs(self) -> dict[str, ConsumerSpec]:
        return {name: CONSUMERS[name] for name in self.parts.consumers}

    # ------------------------------------------------------------------ app and lifecycle

    def app(self, parts: ServiceParts) -> FastAPI:
        """The service's FastAPI app: its routers plus the ops endpoints; the lifespan starts and stops it."""
        self.parts = parts

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self.starting = True
            self.spawn(self.start(parts), name="startup")
            yield
            await self.stop()

        # /docs and /redoc from vendored assets (apidocs.py): FastAPI's defaults need a CDN.
        app = FastAPI(title=f"WhaleFlux {self.name}", version=self.version, lifespan=lifespan,
                      docs_url=None, redoc_url=None)
        mount_api_docs(app)
        app.state.runtime = self
        install_access(app, self.name, self.settings, self.clock)
        for key, value in parts.state.items():
            setattr(app.state, key, value)
        guard_input(app)
        refuse_before_connected(app, self)
        add_ops_routes(app, self)
        add_error_handlers(app, self)
        for exc_type, handler in parts.exception_handlers.items():
            app.add_exception_handler(exc_type, handler)
        for router in parts.routers:
            app.include_router(router)
        return app

    async def start(self, parts: ServiceParts | None = None) -> None:
        """Connect, load, make sure the state is whole, then start consumers and loops."""
        if parts is not None:
            self.parts = parts
        await self._connect()
        redis, bus = self.redis, self.bus
        barrier = self._state.barrier if self._state is not None else None
        self._outbox = Outbox(redis, self.prefix, barrier=barrier)
        self.guard.epochs = EpochStore(redis, self.prefix)
        # A failure here (the store went away between connect and now, say) must not leave a
        # service that never becomes ready: nothing has started yet, so it is tried again.
        async for attempt in AsyncRetrying(retry=retry_if_exception_type((*_STARTUP_TROUBLE, StateUnavailable)),
                                           wait=wait_exponential(multiplier=0.5, max=5.0),
                                           before_sleep=self._log_retry("startup.failed"), reraise=True):
            with attempt:
                if self.parts.on_ready is not None:
                    await self.parts.on_ready()
                await self.guard.ensure()
        specs = self.consumer_specs()
        handlers = {name: self._store_guarded(handler) for name, handler in self.parts.consumers.items()}
        def start_consumer(name: str, spec: ConsumerSpec) -> None:
            bus.start_consumer(spec, handlers[name], redis, self.prefix, self.state_ready)

        loops: list[Loop] = [self._outbox_loop, self.guard.watch]
        if self.settings.scale_out:
            units = service_units(specs, start_consumer, bus.stop_consumer,  # `main` runs the background loops
                                  [functools.partial(self._guard, loop) for loop in self.parts.background])
            self.ownership = Ownership(PartitionStore(redis, self.prefix), self.settings, units, self.log,
                                       on_gained=self.parts.on_ready).begin(self._guard)
        else:
            for name, spec in specs.items():
                start_consumer(name, spec)
            loops = [*self.parts.background, *loops]
        for loop in loops:
            self.spawn(self._guard(loop), name=getattr(loop, "__name__", "loop"))
        self.running = True
        self.log.info("service.started", consumers=sorted(specs))

    async def stop(self) -> None:
        """Units handed over (scaled out), the service's `on_stop`, every task cancelled, connections closed."""
        if self.ownership is not None:
            await self.ownership.leave()
        if self.parts.on_stop is not None:
            await self.parts.on_stop()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.stop_timeout_s)
            for task in stuck:  # it swallowed its cancellation: say which, and stop anyway (a hang says nothing)
                self.log.error("runtime.task_would_not_stop", task=task.get_name(), timeout_s=self.stop_timeout_s,
                               stack=[f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack()])
        if self._bus is not None:
            await self._bus.close(timeout_s=self.stop_timeout_s)
        if self._state is not None:
            await self._state.aclose()
        self.running = False

    async def readiness(self) -> dict[str, bool]:
        """The /readyz checks: NATS, Redis, whole state, every consumer bound (as the service adjusts them)."""
        checks = {"nats": self._bus is not None and self._bus.connected, "redis": False,
                  "state": self.state_ready.is_set()}
        if self.guard.epochs is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                checks["redis"] = await asyncio.wait_for(self.guard.epochs.ping(), 1.0)
        bound = self._bus.bound if self._bus is not None else set()
        # A delivery loop that ended (it never should) leaves its name bound: such a consumer takes nothing.
        ended = set(self._bus.ended_consumers()) if self._bus is not None else set()
        names = self._bus.running_consumers() if self.ownership and self._bus else self.consumer_specs()  # its units
        for name in sorted(names):
            checks[f"consumer:{name}"] = name in bound and name not in ended
        if self.ownership is not None:
            checks["ownership"] = self.ownership.live
        if self.parts.readiness is not None:
            checks = await self.parts.readiness(checks)
        return checks

    async def metrics_body(self) -> bytes:
        body = generate_latest(self.registry)
        if self.parts.metrics_text is not None:
            body += await self.parts.metrics_text()
        return body

    # ------------------------------------------------------------------ plumbing

    def _log_retry(self, event: str) -> Callable[[RetryCallState], None]:
        def log(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else None
            self.log.warning(event, error=repr(error), retry_in_s=delay)
        return log

    async def _connect(self) -> None:
        """Reach Redis and NATS, retrying (with back-off, forever) until both answer."""
        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.2, max=5.0),
                                           before_sleep=self._log_retry("startup.waiting"), reraise=True):
            with attempt:
                if self._redis is None:
                    state = StateConnection(self.settings, self.prefix)
                    try:
                        await EpochStore(state.redis, self.prefix).ping()
                    except BaseException:
                        await state.aclose()
                        raise
                    self._state, self._redis = state, state.redis
                if self._bus is None:
                    self._bus = await Bus.connect(self.settings.nats_url, source=self.source,
                                                  user=self.settings.nats_user,
                                                  password=self.settings.secret("nats_password"),
                                                  metrics=self.bus_metrics, clock=self.clock,
                                                  replicas=self.settings.nats_replicas)
                await self._bus.ensure_streams()

    async def _rebuild(self) -> None:
        if self.parts.rebuild is not None:
            await self.parts.rebuild()
        else:
            await self.replay_history()

    async def replay_history(self) -> None:
        """The default rebuild: the history consumers are deleted, so they are created again at the
        start of their streams and replay them (handlers are idempotent, and their dedup markers
        went with the state), then `on_ready` reloads what it keeps in memory."""
        for name, spec in self.consumer_specs().items():
            if spec.deliver_new:
                continue  # live feeds have nothing to rebuild from
            try:
                await self.bus.js.delete_consumer(spec.stream, name)
                self.log.warning("state.replaying", consumer=name, stream=spec.stream)
            except NotFoundError:
                pass  # never created: a first start
        if self.running and self.parts.on_ready is not None:  # lost while running: memory is stale
            await self.parts.on_ready()

    def _store_guarded(self, handler: Handler | BatchHandler) -> Handler | BatchHandler:
        """A handler that hits an unreachable store pauses the consumers and asks for a redelivery.

        Behind Sentinel the handler's writes are on the replicas before it returns (and the event is acked)."""
        barrier = self._state.barrier if self._state is not None else None

        async def guarded(*args: Any) -> Any:
            try:
                outcome = await handler(*args)
                if barrier is not None:
                    await barrier()
                return outcome
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.state_down(f"state store unreachable ({type(exc).__name__})")
                raise Retry(f"state store unreachable: {exc}", delay_s=2.0) from exc
            except StateUnavailable as exc:
                self.state_down(str(exc))
                raise Retry(str(exc), delay_s=2.0) from exc

        return batch_handler(guarded) if is_batch_handler(handler) else guarded

    async def _outbox_loop(self) -> None:
        """Publish what a failed or interrupted flush left behind."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.publish_staged()
            except (TimeoutError, RedisError, OSError, nats.errors.Error, StateUnavailable) as exc:
                self.log.warning("outbox.flush_failed", error=repr(exc))

    async def _guard(self, loop: Loop) -> None:
        """Restart a background loop that raised, after a pause; never let it die."""
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a loop's bug must not stop the service: logged, restarted
                self.log.error("background.crashed", loop=getattr(loop, "__name__", "loop"), error=repr(exc))
                await asyncio.sleep(1.0)


def serve(app: FastAPI, runtime: Runtime) -> None:
    """Run one service process until SIGTERM/SIGINT."""
    configure_logging(runtime.name, runtime.settings.log_level)
    uvicorn.run(app, host=runtime.settings.http_host, port=runtime.settings.http_port, log_config=None,
                access_log=True, lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
