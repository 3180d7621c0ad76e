"""Inventory service: every GPU agents registered, what was declared about it, leases, rollups and findings.

Consumes node.registered / node.heartbeat (discovery), job.placed / finished /
failed (allocations) and gpu.telemetry (utilization). Produces lease.expiring
and lease.expired through the outbox. A node that stops reporting is marked
missing with the time it was last seen; its GPUs are never deleted.
The decisions live in assets.py, reconcile.py, leases.py, rollups.py and
findings.py; this module only moves data between them, Redis and NATS.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Literal

from fastapi import FastAPI, HTTPException, Query, Request
from pydantic import BaseModel, Field
from redis.exceptions import WatchError

from whaleflux.shared import subjects
from whaleflux.shared.events import (
    Envelope,
    GpuIdentity,
    GpuTelemetry,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    LeaseExpired,
    NodeHeartbeat,
    NodeRegistered,
    make_envelope,
)
from whaleflux.shared.configstore import StoredConfig
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from . import findings as fnd
from . import views
from .assets import AssetsError, Declarations, parse_declarations
from .leases import Notice, due_notices, leases, notice_event
from .reconcile import DiscoveredGpu, Reconciliation, reconcile
from .rollups import HOUR, Allocation, UtilSums, hour_floor, last_active, rollup, sample_sums


class InventorySettings(CommonSettings):
    http_port: int = 8705
    missing_after_s: float = Field(30.0, gt=0)
    assets_file: str | None = Field(None, description="YAML declarations; re-read when its content changes")
    lease_horizons_days: list[int] = Field(default_factory=lambda: [30, 7, 1])
    check_interval_s: float = Field(60.0, gt=0, description="how often leases and the assets file are checked")
    idle_threshold_pct: float = Field(5.0, ge=0, le=100)
    reserved_idle_hours: float = Field(72.0, gt=0)
    consolidation_threshold: float = Field(0.3, ge=0, le=1)
    consolidation_days: float = Field(3.0, gt=0)
    retention_days: float = Field(40.0, gt=0)


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
    rack: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    registered_at: datetime | None = None


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
                    status=status, last_seen=n.last_seen, rack=n.rack, pci_bus_id=g.pci_bus_id,
                    driver_version=g.driver_version, vbios_version=g.vbios_version, registered_at=n.registered_at,
                )
            )
    return sorted(rows, key=lambda r: (r.node, r.index))


def _alloc_key(job_id: str, attempt: int, rank: int | None = None) -> str:
    """One allocation per attempt, and per node of a gang spanning nodes (each part ends on its own)."""
    return f"{job_id}:{attempt}" + (f"#r{rank}" if rank else "")


class InventoryService(ServiceBase):
    name = "inventory"

    def __init__(self, settings: InventorySettings, **kw):
        super().__init__(settings, **kw)
        self.settings: InventorySettings = settings
        self._declared: StoredConfig[Declarations] | None = None

    def consumers(self):
        return {
            "inventory-nodes": self.on_node_event,
            "inventory-jobs": self.on_job_event,
            "inventory-telemetry": self.on_telemetry,
        }

    def k(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # ---------------------------------------------------------------- discovery

    def _key(self, cluster: str, node: str) -> str:
        return f"{cluster}/{node}"

    async def _get(self, cluster: str, node: str) -> NodeRecord | None:
        raw = await self.redis.hget(self.k("nodes"), self._key(cluster, node))
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
        await self.redis.hset(self.k("nodes"), self._key(data.cluster, data.node), record.model_dump_json())

    async def nodes(self) -> list[NodeRecord]:
        raw = await self.redis.hgetall(self.k("nodes"))
        return [NodeRecord.model_validate_json(v) for v in raw.values()]

    async def discovered(self, now: datetime) -> list[DiscoveredGpu]:
        rows = gpu_rows(await self.nodes(), now, timedelta(seconds=self.settings.missing_after_s))
        return [
            DiscoveredGpu(r.uuid, r.index, r.model, r.node, r.cluster, r.rack, r.pool, r.status, r.last_seen,
                          r.registered_at or r.last_seen)
            for r in rows
        ]

    # ---------------------------------------------------------------- allocations and utilization

    async def on_job_event(self, env: Envelope, data) -> None:
        if isinstance(data, JobSubmitted):
            queued = {"gpus": data.gpus, "models": data.gpu_models, "expected_runtime_s": data.expected_runtime_s}
            await self.redis.hsetnx(self.k("queued"), data.job_id, json.dumps(queued))
            return
        if isinstance(data, (JobPlaced, JobRejected)):
            await self.redis.hdel(self.k("queued"), data.job_id)
        if isinstance(data, JobPlaced):
            key = _alloc_key(data.job_id, data.attempt, data.rank)
            # The placement's envelope time is when the scheduler allocated the GPUs.
            record = json.dumps({"gpus": data.gpu_uuids, "start": env.time.isoformat()})
            ended = await self.redis.hexists(self.k("alloc:end"), key)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.k("alloc:start"), key, record)
                if not ended:  # the end can arrive first when events are replayed out of order
                    for gpu in data.gpu_uuids:
                        pipe.hset(self.k("alloc:open"), gpu, f"{key}|{env.time.isoformat()}")
                await pipe.execute()
        elif isinstance(data, (JobFinished, JobFailed)):
            key = _alloc_key(data.job_id, data.attempt, data.rank)
            end = data.finished_at if isinstance(data, JobFinished) else data.failed_at
            await self.redis.hset(self.k("alloc:end"), key, end.isoformat())
            raw = await self.redis.hget(self.k("alloc:start"), key)
            if raw:
                gpus = json.loads(raw)["gpus"]
                holders = await self.redis.hmget(self.k("alloc:open"), gpus)
                stale = [g for g, h in zip(gpus, holders) if h and h.split("|")[0] == key]
                if stale:
                    await self.redis.hdel(self.k("alloc:open"), *stale)

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        uuids = [g.uuid for g in data.gpus]
        if not uuids:
            return
        holders = await self.redis.hmget(self.k("alloc:open"), uuids)
        allocated = {
            u for u, h in zip(uuids, holders) if h and datetime.fromisoformat(h.split("|", 1)[1]) <= data.sample_time
        }
        sums = sample_sums([(g.uuid, g.utilization_gpu_pct) for g in data.gpus], allocated)
        key = self.k(f"util:{int(hour_floor(data.sample_time).timestamp())}")
        async with self.redis.pipeline(transaction=False) as pipe:
            for uuid, s in sums.items():
                pipe.hincrbyfloat(key, f"{uuid}|as", s.allocated_sum)
                pipe.hincrby(key, f"{uuid}|an", s.allocated_n)
                pipe.hincrbyfloat(key, f"{uuid}|s", s.total_sum)
                pipe.hincrby(key, f"{uuid}|n", s.total_n)
            pipe.expire(key, int(self.settings.retention_days * 86400))
            await pipe.execute()

    async def allocations(self) -> list[Allocation]:
        starts = await self.redis.hgetall(self.k("alloc:start"))
        ends = await self.redis.hgetall(self.k("alloc:end"))
        out = []
        for key, raw in starts.items():
            rec = json.loads(raw)
            end = datetime.fromisoformat(ends[key]) if key in ends else None
            out.append(Allocation(key, tuple(rec["gpus"]), datetime.fromisoformat(rec["start"]), end))
        return out

    async def open_allocations(self) -> dict[str, str]:
        """GPU uuid -> job id holding it now."""
        raw = await self.redis.hgetall(self.k("alloc:open"))
        return {gpu: v.split("|")[0].rsplit(":", 1)[0] for gpu, v in raw.items()}

    async def utilization(self, start: datetime, end: datetime) -> dict[tuple[str, datetime], UtilSums]:
        hours = []
        h = hour_floor(start)
        while h < end:
            hours.append(h)
            h += HOUR
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in hours:
                pipe.hgetall(self.k(f"util:{int(h.timestamp())}"))
            results = await pipe.execute()
        out: dict[tuple[str, datetime], UtilSums] = {}
        for h, fields in zip(hours, results):
            for name, value in fields.items():
                uuid, part = name.rsplit("|", 1)
                s = out.setdefault((uuid, h), UtilSums())
                if part == "as":
                    s.allocated_sum = float(value)
                elif part == "an":
                    s.allocated_n = int(value)
                elif part == "s":
                    s.total_sum = float(value)
                else:
                    s.total_n = int(value)
        return out

    async def rollups(self, by: str, start: datetime, end: datetime, now: datetime, rec: Reconciliation | None = None):
        rec = rec or await self.reconciliation(now)
        groups = {a.uuid: (a.uuid if by == "gpu" else a.pool) for a in rec.assets}
        return rollup(groups, await self.allocations(), await self.utilization(start, min(end, now)), start, end, now)

    async def prune(self, now: datetime) -> int:
        """Forget allocations that ended before the retention window."""
        cutoff = now - timedelta(days=self.settings.retention_days)
        ends = await self.redis.hgetall(self.k("alloc:end"))
        old = [key for key, t in ends.items() if datetime.fromisoformat(t) < cutoff]
        if old:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self.k("alloc:start"), *old)
                pipe.hdel(self.k("alloc:end"), *old)
                await pipe.execute()
        return len(old)

    # ---------------------------------------------------------------- declarations

    @property
    def declared(self) -> StoredConfig[Declarations]:
        """The declarations document kept in Redis (file or upload; the last good one stays)."""
        if self._declared is None:
            self._declared = StoredConfig(self.redis, self.k("declarations"), parse_declarations, self.clock, self.log, "assets")
        return self._declared

    async def declarations(self) -> Declarations:
        """The declarations in force (empty until a good file or upload arrives)."""
        decl = await self.declared.current()
        return Declarations() if decl is None else decl

    async def apply_declarations(self, text: str, source: str, file_hash: str | None = None) -> Declarations:
        """Check and store new declarations; on AssetsError the previous ones stay in force."""
        return await self.declared.apply(text, source, file_hash)

    async def reload_file(self) -> bool:
        """Apply the assets file if its content changed since it was last applied; True if applied."""
        return await self.declared.reload_file(self.settings.assets_file)

    async def reconciliation(self, now: datetime) -> Reconciliation:
        return reconcile(await self.declarations(), await self.discovered(now), now)

    # ---------------------------------------------------------------- leases

    async def check_leases(self) -> list[Notice]:
        """Publish the lease notices due now, each once; return them."""
        now = self.clock()
        decl = await self.declarations()
        rec = reconcile(decl, await self.discovered(now), now)
        current = leases(decl, rec.assets, now)
        key = self.k("lease:fired")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                # WATCH: two replicas checking at once stage each notice only once.
                await pipe.watch(key)
                fired = set(await pipe.smembers(key))
                publish, done = due_notices(current, tuple(self.settings.lease_horizons_days), now, fired)
                if not done:
                    return []
                pipe.multi()
                pipe.sadd(key, *done)
                for notice in publish:
                    data = notice_event(notice, now)
                    subject = subjects.LEASE_EXPIRED if isinstance(data, LeaseExpired) else subjects.LEASE_EXPIRING
                    env = make_envelope(
                        data, source=f"whaleflux/inventory/{self.settings.instance}", subject=notice.lease.contract.id,
                        event_id=notice.event_id, correlation_id=f"lease-{notice.lease.contract.id}", time=now,
                    )
                    self.outbox.stage(pipe, subject, env)
                await pipe.execute()
        except WatchError:
            return []  # another replica got there first; the next check sees its work
        await self.publish_staged()
        for notice in publish:
            self.log.info("lease.notice", contract=notice.lease.contract.id, kind=notice.kind,
                          deadline=notice.deadline, horizon_days=notice.horizon_days)
        return publish

    async def on_ready(self) -> None:
        await self.publish_staged()  # notices staged before a crash go out now
        await self.reload_file()

    def background(self):
        return [self._check_loop]

    async def _check_loop(self) -> None:
        while True:
            try:
                await self.reload_file()
                await self.check_leases()
                await self.prune(self.clock())
            except Exception as exc:  # next tick tries again
                self.log.warning("inventory.check_failed", error=repr(exc))
            await asyncio.sleep(self.settings.check_interval_s)

    async def queued(self) -> list[fnd.QueuedJob]:
        """Jobs submitted and not yet placed or rejected."""
        raw = await self.redis.hgetall(self.k("queued"))
        return [
            fnd.QueuedJob(job_id, q["gpus"], tuple(q["models"]), q["expected_runtime_s"])
            for job_id, q in sorted((k, json.loads(v)) for k, v in raw.items())
        ]

    # ---------------------------------------------------------------- findings

    async def all_findings(self, now: datetime) -> list[fnd.Finding]:
        s = self.settings
        rec = await self.reconciliation(now)
        by_uuid = {a.uuid: a for a in rec.assets}
        allocs = await self.allocations()
        last_hour = hour_floor(now) - HOUR
        window = hour_floor(now) - timedelta(days=s.consolidation_days)
        gpu_rows_ = await self.rollups("gpu", last_hour, hour_floor(now), now, rec)
        pool_rows = await self.rollups("pool", window, hour_floor(now), now, rec)
        holders = await self.open_allocations()
        out = fnd.idle_allocated(gpu_rows_, by_uuid, holders, s.idle_threshold_pct)
        out += fnd.reserved_idle(rec.assets, last_active(allocs, now), now, s.reserved_idle_hours)
        out += fnd.consolidation(pool_rows, rec.assets, s.consolidation_threshold, s.consolidation_days)
        out.append(fnd.capacity_finding(fnd.capacity(rec.assets, set(holders)), await self.queued()))
        out += fnd.reconciliation_findings(rec, by_uuid)
        return out

    # ---------------------------------------------------------------- HTTP

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

        @app.get("/v1/inventory", tags=["inventory"])
        async def inventory(
            by: Literal["model", "pool", "ownership"] = "model",
            hours: float = Query(24, gt=0, le=24 * 40, description="window of the mean utilization"),
        ) -> list[dict]:
            """Per model, pool or ownership: GPUs, active, missing, allocated now, mean utilization while allocated."""
            now = self.clock()
            rec = await self.reconciliation(now)
            rows = await self.rollups("gpu", now - timedelta(hours=hours), now, now, rec)
            return views.grouped(rec.assets, by, set(await self.open_allocations()), rows)

        @app.get("/v1/assets", tags=["inventory"])
        async def assets() -> list[dict]:
            """Per GPU uuid: ownership, pool, site, cluster, rack, and lease or purchase terms (money as strings)."""
            return [views.asset_json(a) for a in (await self.reconciliation(self.clock())).assets]

        @app.get("/v1/declarations", tags=["inventory"])
        async def declared() -> dict:
            """The declarations in force, where they came from, and the last rejected attempt."""
            meta = await self.redis.hgetall(self.k("declarations"))
            error = await self.redis.get(self.k("declarations:error"))
            rec = await self.reconciliation(self.clock())
            return {
                "source": meta.get("source"), "applied_at": meta.get("applied_at"),
                "declarations": (await self.declarations()).model_dump(mode="json"),
                "last_error": json.loads(error) if error else None,
                "never_seen": rec.never_seen, "undeclared": rec.undeclared, "mismatches": rec.mismatches,
            }

        @app.put("/admin/assets", tags=["admin"], dependencies=[admin])
        async def upload(request: Request) -> dict:
            """Replace the declarations with the YAML body; 422 lists every problem (line, key), nothing changes."""
            body = (await request.body()).decode("utf-8", errors="replace")
            try:
                decl = await self.apply_declarations(body, "upload")
            except AssetsError as exc:
                raise HTTPException(status_code=422, detail={"errors": exc.errors}) from None
            notices = await self.check_leases()
            return {"applied": True, "contracts": len(decl.contracts), "assets": len(decl.assets),
                    "notices_published": [n.event_id for n in notices]}

        @app.get("/v1/leases", tags=["inventory"])
        async def lease_list() -> list[dict]:
            """Every contract: state, days left, notice deadline, monthly cost, renewal."""
            now = self.clock()
            decl = await self.declarations()
            rec = reconcile(decl, await self.discovered(now), now)
            return [views.lease_json(lease, now) for lease in sorted(leases(decl, rec.assets, now), key=lambda x: x.term_end)]

        @app.get("/v1/findings", tags=["inventory"])
        async def findings() -> list[dict]:
            """Idle-allocated GPUs, reserved GPUs idle for days, pools to consolidate, capacity, reconciliation."""
            return [views.finding_json(f) for f in await self.all_findings(self.clock())]

        @app.get("/v1/capacity", tags=["inventory"])
        async def capacity() -> list[dict]:
            """Free GPUs and whole free nodes per model and pool, now."""
            rec = await self.reconciliation(self.clock())
            return [views.capacity_json(r) for r in fnd.capacity(rec.assets, set(await self.open_allocations()))]

        @app.get("/v1/rollups", tags=["inventory"])
        async def rollup_rows(
            by: Literal["gpu", "pool"] = "pool",
            start: datetime | None = Query(None, description="default: 24 hours ago"),
            end: datetime | None = Query(None, description="default: now"),
        ) -> list[dict]:
            """Hourly allocated seconds, allocated fraction and mean utilization while allocated."""
            now = self.clock()
            end = end or now
            start = start or end - timedelta(hours=24)
            if start.tzinfo is None or end.tzinfo is None:
                raise HTTPException(status_code=400, detail="start/end: give a timezone (e.g. 2026-01-01T00:00:00Z)")
            if end <= start or end - start > timedelta(days=self.settings.retention_days):
                raise HTTPException(status_code=400, detail="start/end: end must be after start, within retention_days")
            return [views.hour_json(r) for r in await self.rollups(by, start, end, now)]


def main() -> None:
    run_service(InventoryService(InventorySettings()))
