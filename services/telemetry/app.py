"""Telemetry service: latest sample and rolling history of every GPU, per-job usage, DCGM `/metrics`.

Consumes gpu.telemetry, node.registered and the job events; publishes nothing.
This module only wires the parts on the shared `Runtime`: store.py (every
Redis key), ingest.py (registrations, batches, history sweep) around the pure
admission.py and history.py, runs.py (job events, usage) around jobs.py and
usage.py, and api.py (the HTTP routes).
"""

from __future__ import annotations

import asyncio
import gc

from fastapi import FastAPI
from redis.asyncio import Redis

from whaleflux.shared.runtime import Clock, Runtime, ServiceParts, serve, system_clock

from . import api
from .ingest import Ingest, IngestMetrics
from .runs import Runs
from .settings import TelemetrySettings
from .store import TelemetryStore
from .views import GpuStatus, LatestSample

__all__ = ["LatestSample", "TelemetryService", "TelemetrySettings", "build", "main"]


class TelemetryService:
    """The telemetry parts on one runtime, and the app serving them (`build` makes one)."""

    def __init__(self, settings: TelemetrySettings | None = None, clock: Clock = system_clock) -> None:
        self.settings = settings or TelemetrySettings()
        self.clock = clock
        self.runtime = Runtime("telemetry", self.settings, clock)
        self.store = TelemetryStore(self.runtime)
        self.metrics = IngestMetrics(self.runtime.registry)
        self.stored = self.metrics.stored
        self.ingest = Ingest(self.store, self.settings, clock, self.metrics, self.runtime.log)
        self.runs = Runs(self.store, self.settings, clock)
        self.on_registered = self.ingest.on_registered
        self.on_telemetry_batch = self.ingest.on_telemetry_batch
        self.app: FastAPI = self.runtime.app(ServiceParts(
            consumers={"telemetry-gpu": self.ingest.on_telemetry_batch, "telemetry-nodes": self.ingest.on_registered,
                       "telemetry-jobs": self.runs.on_job},
            routers=[api.router],
            on_ready=self.on_ready,
            background=[self.maintain_history, self.runs.settle_loop],
            metrics_text=self.dcgm_text,
            state={"telemetry": self},
        ))

    async def on_ready(self) -> None:
        await self.ingest.load()
        # Everything loaded so far lives as long as the process: keep it out of the cyclic
        # GC's full collections, which otherwise pause ingest for tens of ms (p99 latency).
        gc.freeze()

    async def maintain_history(self) -> None:
        """Roll up and trim the history of nodes that fell silent (ingest does it for the others)."""
        while True:
            await self.ingest.roll_and_trim()
            await asyncio.sleep(self.settings.maintenance_interval_s)

    async def dcgm_text(self) -> bytes:
        """/metrics after the service's own families: every fresh GPU's DCGM families."""
        if not self.runtime.connected:
            return b""
        return await api.dcgm_text(self.store, self.runs, self.clock(), self.settings.stale_after_s)

    async def statuses(self, node: str | None = None) -> list[GpuStatus]:
        """Every GPU's latest sample with age, flags, last XID and job (as `GET /v1/gpus`)."""
        return await api.gpu_statuses(self.store, self.runs, self.clock(), self.settings.stale_after_s, node)

    async def start(self) -> None:
        """Connect and start consumers and loops (what the app's lifespan does; tests call it directly)."""
        await self.runtime.start()

    async def stop(self) -> None:
        await self.runtime.stop()

    # What tests/test_bus_batch.py (the bus's batch mode, through this service) reaches for.
    _start = start

    @property
    def redis(self) -> Redis:
        return self.runtime.redis

    def _k(self, *parts: str) -> str:
        return self.store.key(*parts)

    async def latest(self, node: str | None = None) -> list[LatestSample]:
        return await self.store.latest(node)


def build(settings: TelemetrySettings | None = None, clock: Clock = system_clock) -> tuple[FastAPI, TelemetryService]:
    """The telemetry app and its service object (not started: the app's lifespan starts it)."""
    svc = TelemetryService(settings, clock)
    return svc.app, svc


def main() -> None:
    app, svc = build()
    serve(app, svc.runtime)
