"""Inventory service: every GPU agents have registered, and when each node was last seen.

Consumes node.registered and node.heartbeat. A node that stops reporting is
marked missing with the time it was last seen; its GPUs are never deleted.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from fastapi import FastAPI
from pydantic import BaseModel, Field

from whaleflux.shared.events import Envelope, GpuIdentity, NodeHeartbeat, NodeRegistered
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings


class InventorySettings(CommonSettings):
    http_port: int = 8705
    missing_after_s: float = Field(30.0, gt=0)


class NodeRecord(BaseModel):
    cluster: str
    node: str
    rack: str | None
    pool: str | None
    registered_at: datetime
    last_seen: datetime
    gpus: list[GpuIdentity]


class GpuRow(BaseModel):
    uuid: str
    index: int
    model: str
    name: str
    serial: str | None
    memory_total_mib: float
    node: str
    cluster: str
    pool: str | None
    status: str
    last_seen: datetime


def gpu_rows(nodes: list[NodeRecord], now: datetime, missing_after: timedelta) -> list[GpuRow]:
    """Flatten nodes to GPUs with a status: `active`, or `missing` if the node went quiet."""
    rows = []
    for n in nodes:
        status = "missing" if now - n.last_seen > missing_after else "active"
        for g in n.gpus:
            rows.append(
                GpuRow(
                    uuid=g.uuid, index=g.index, model=g.model, name=g.name, serial=g.serial,
                    memory_total_mib=g.memory_total_mib, node=n.node, cluster=n.cluster, pool=n.pool,
                    status=status, last_seen=n.last_seen,
                )
            )
    return sorted(rows, key=lambda r: (r.node, r.index))


class InventoryService(ServiceBase):
    name = "inventory"

    def __init__(self, settings: InventorySettings, **kw):
        super().__init__(settings, **kw)
        self.settings: InventorySettings = settings

    def consumers(self):
        return {"inventory-nodes": self.on_node_event}

    def _key(self, cluster: str, node: str) -> str:
        return f"{cluster}/{node}"

    async def _get(self, cluster: str, node: str) -> NodeRecord | None:
        raw = await self.redis.hget(f"{self.prefix}:nodes", self._key(cluster, node))
        return NodeRecord.model_validate_json(raw) if raw else None

    async def on_node_event(self, env: Envelope, data) -> None:
        current = await self._get(data.cluster, data.node)
        if isinstance(data, NodeRegistered):
            record = NodeRecord(
                cluster=data.cluster, node=data.node, rack=data.rack, pool=data.pool,
                registered_at=current.registered_at if current else env.time,
                last_seen=max(env.time, current.last_seen) if current else env.time,
                gpus=data.gpus,
            )
        elif isinstance(data, NodeHeartbeat) and current is not None:
            record = current.model_copy(update={"last_seen": max(env.time, current.last_seen)})
        else:
            return  # a heartbeat before registration: the registration will follow
        await self.redis.hset(f"{self.prefix}:nodes", self._key(data.cluster, data.node), record.model_dump_json())

    async def nodes(self) -> list[NodeRecord]:
        raw = await self.redis.hgetall(f"{self.prefix}:nodes")
        return [NodeRecord.model_validate_json(v) for v in raw.values()]

    def add_routes(self, app: FastAPI, admin) -> None:
        missing_after = timedelta(seconds=self.settings.missing_after_s)

        @app.get("/v1/gpus", tags=["inventory"])
        async def gpus() -> list[GpuRow]:
            """Every GPU ever registered, with its status."""
            return gpu_rows(await self.nodes(), self.clock(), missing_after)

        @app.get("/v1/summary", tags=["inventory"])
        async def summary() -> list[dict]:
            """GPU counts by model and status."""
            counts = Counter((r.model, r.status) for r in gpu_rows(await self.nodes(), self.clock(), missing_after))
            return [{"model": m, "status": s, "gpus": c} for (m, s), c in sorted(counts.items())]


def main() -> None:
    run_service(InventoryService(InventorySettings()))
