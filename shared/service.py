"""The old base class of a service, kept as a thin shim over `shared.runtime.Runtime`.

A service not yet moved to `Runtime` + `ServiceParts` (docs/architecture.md) still
subclasses `ServiceBase` and overrides `consumers`, `add_routes`, `on_ready`,
`background`, `metrics_text`, `rebuild_state`, `readiness`, `publish_staged` or
`stop`; each becomes a part of the runtime. Unlike the runtime proper, the shim
keeps answering any `ValueError` with 400, as these services always have.
Deleted once no service uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.params import Depends
from fastapi.responses import JSONResponse
from redis.asyncio import Redis

from .bus import BatchHandler, Bus, Handler
from .clock import Clock, system_clock
from .deps import AdminDep
from .errors import StateUnavailable
from .logs import configure_logging
from .outbox_store import Outbox
from .runtime import Runtime, ServiceParts, serve
from .settings import CommonSettings
from .streams import ConsumerSpec
from .version import __version__

__all__ = ["Clock", "ServiceBase", "StateUnavailable", "run_service", "system_clock"]


class ServiceBase:
    """Subclass and set `name`; override `consumers`, `add_routes`, `on_ready`, `background`."""

    name: str = "service"
    version: str = __version__

    def __init__(self, settings: CommonSettings, clock: Clock = system_clock):
        self.settings = settings
        self.clock = clock
        self.runtime = Runtime(self.name, settings, clock, self.version)
        self.registry = self.runtime.registry
        self.bus_metrics = self.runtime.bus_metrics
        self.log = self.runtime.log

    # ----------------------------------------------------------------- the runtime's state, as before

    @property
    def redis(self) -> Redis | None:
        return self.runtime._redis

    @property
    def bus(self) -> Bus | None:
        return self.runtime._bus

    @property
    def outbox(self) -> Outbox | None:
        return self.runtime._outbox

    @property
    def epoch(self) -> str | None:
        return self.runtime.epoch

    @property
    def state_ready(self) -> asyncio.Event:
        return self.runtime.state_ready

    @property
    def state_problem(self) -> str | None:
        return self.runtime.state_problem

    @property
    def _tasks(self) -> list[asyncio.Task[Any]]:
        return self.runtime._tasks

    @property
    def prefix(self) -> str:
        """Redis key prefix: each service keeps its state under its own."""
        return f"wf:{self.name}"

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}:state-epoch"

    def require_state(self) -> None:
        self.runtime.require_state()

    def _state_down(self, problem: str) -> None:
        self.runtime.state_down(problem)

    # ----------------------------------------------------------------- to override

    def consumers(self) -> dict[str, Handler | BatchHandler]:
        """Durable consumer name (from streams.CONSUMERS) -> handler."""
        return {}

    def consumer_specs(self) -> dict[str, ConsumerSpec]:
        return self.runtime.consumer_specs()

    def add_routes(self, app: FastAPI, admin: Depends) -> None:
        """Add this service's HTTP API; `admin` is the dependency that requires the bearer token."""

    async def on_ready(self) -> None:
        """Called once NATS, Redis and the streams are ready, before consumers start."""

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        """Long-running loops started after `on_ready`; each must survive its own errors."""
        return []

    async def metrics_text(self) -> bytes:
        """What /metrics adds after the registry's families (e.g. DCGM counters)."""
        return b""

    async def rebuild_state(self) -> None:
        """Rebuild this service's Redis state from JetStream (default: replay the history consumers)."""
        await self.runtime.replay_history()

    async def readiness(self) -> dict[str, bool]:
        return await self.runtime.base_readiness()

    async def publish_staged(self) -> None:
        """Publish what the outbox holds (call after executing a pipeline that staged events)."""
        await self.runtime.outbox.flush(self.runtime.bus)

    async def stop(self) -> None:
        await self.runtime.close()

    # ----------------------------------------------------------------- wiring

    def _parts(self) -> ServiceParts:
        async def readiness(checks: dict[str, bool]) -> dict[str, bool]:
            return await self.readiness() if type(self).readiness is not ServiceBase.readiness else checks

        return ServiceParts(consumers=self.consumers(), on_ready=self.on_ready, background=self.background(),
                            rebuild=self.rebuild_state, metrics_text=self.metrics_text, on_stop=self.stop,
                            publish=self.publish_staged, readiness=readiness)

    async def _start(self) -> None:
        await self.runtime.start(self._parts())

    def create_app(self) -> FastAPI:
        app = self.runtime.app(self._parts())

        async def value_error(request: Request, exc: Exception) -> Response:
            return JSONResponse({"detail": str(exc)}, status_code=400)

        app.add_exception_handler(ValueError, value_error)
        self.add_routes(app, AdminDep)
        return app


def run_service(service: ServiceBase) -> None:
    """Run one service process until SIGTERM/SIGINT."""
    configure_logging(service.name, service.settings.log_level)
    serve(service.create_app(), service.runtime)
