"""Telemetry service: the latest sample of every GPU, checked against what its node registered.

Consumes gpu.telemetry and node.registered. A sample for a node that has not
registered yet is retried (registration may still be in flight) and
dead-lettered if it never appears; a GPU the node did not register is rejected
at once.
"""

from __future__ import annotations

from datetime import timedelta

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from whaleflux.shared.bus import Reject, Retry
from whaleflux.shared.events import Envelope, GpuSample, GpuTelemetry, NodeRegistered
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings


class TelemetrySettings(CommonSettings):
    http_port: int = 8701
    max_clock_skew_s: float = Field(300.0, gt=0)


class LatestSample(BaseModel):
    cluster: str
    node: str
    seq: int
    sample_time: str
    gpu: GpuSample


class TelemetryService(ServiceBase):
    name = "telemetry"

    def __init__(self, settings: TelemetrySettings, **kw):
        super().__init__(settings, **kw)
        self.settings: TelemetrySettings = settings
        self._known: dict[str, set[str]] = {}  # node -> registered GPU uuids (cache of Redis)

    def consumers(self):
        return {"telemetry-gpu": self.on_telemetry, "telemetry-nodes": self.on_registered}

    async def on_registered(self, env: Envelope, data: NodeRegistered) -> None:
        key = f"{self.prefix}:node:{data.cluster}:{data.node}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if data.gpus:
                pipe.sadd(key, *[g.uuid for g in data.gpus])
            await pipe.execute()
        self._known[f"{data.cluster}:{data.node}"] = {g.uuid for g in data.gpus}

    async def _registered_gpus(self, cluster: str, node: str) -> set[str]:
        cached = self._known.get(f"{cluster}:{node}")
        if cached is None:
            cached = set(await self.redis.smembers(f"{self.prefix}:node:{cluster}:{node}"))
            if cached:
                self._known[f"{cluster}:{node}"] = cached
        return cached

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        skew = abs(data.sample_time - self.clock())
        if skew > timedelta(seconds=self.settings.max_clock_skew_s):
            raise Reject(f"sample_time is {skew.total_seconds():.0f}s away from now (limit {self.settings.max_clock_skew_s:.0f}s)")
        known = await self._registered_gpus(data.cluster, data.node)
        if not known:
            raise Retry(f"node {data.cluster}/{data.node} has not registered its GPUs", delay_s=1.0)
        unknown = [g.uuid for g in data.gpus if g.uuid not in known]
        if unknown:
            raise Reject(f"unknown GPU uuid(s) for node {data.cluster}/{data.node}: {', '.join(unknown[:4])}")
        sample_time = data.sample_time.isoformat()
        mapping = {
            g.uuid: LatestSample(cluster=data.cluster, node=data.node, seq=data.seq, sample_time=sample_time, gpu=g).model_dump_json()
            for g in data.gpus
        }
        if mapping:
            await self.redis.hset(f"{self.prefix}:latest", mapping=mapping)

    async def latest(self) -> list[LatestSample]:
        raw = await self.redis.hgetall(f"{self.prefix}:latest")
        return sorted((LatestSample.model_validate_json(v) for v in raw.values()), key=lambda s: (s.node, s.gpu.index))

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/gpus", tags=["telemetry"])
        async def gpus(node: str | None = None) -> list[LatestSample]:
            """Latest sample of every GPU (optionally of one node)."""
            return [s for s in await self.latest() if node is None or s.node == node]

        @app.get("/v1/gpus/{uuid}", tags=["telemetry"])
        async def gpu(uuid: str) -> LatestSample:
            raw = await self.redis.hget(f"{self.prefix}:latest", uuid)
            if raw is None:
                raise HTTPException(404, f"no sample for GPU {uuid!r}")
            return LatestSample.model_validate_json(raw)


def main() -> None:
    run_service(TelemetryService(TelemetrySettings()))
