"""Telemetry's Redis state (`wf:telemetry`): every key and encoding the service uses, and nothing else does.

The keys are listed in docs/services/telemetry.md. A fetch of batches is
written with one script call (store_script.py); everything else is plain
hashes, sets and sorted sets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol, cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from whaleflux.shared.contracts import Holder, HolderChange, JobHolds
from whaleflux.shared.events import GpuIdentity, GpuTelemetry, NodeRegistered, decode_typed

from .admission import Last
from .history import Point, Rollup
from .jobs import JobRun
from .store_script import STORE_SCRIPT, BatchWrite, decode_last, latest_entries, samples_of
from .usage import JobUsage
from .views import JobRef, LatestSample

__all__ = ["TelemetryStore", "latest_entries"]

class Connection(Protocol):
    """Where the store finds its Redis (the service runtime: connected after start-up)."""

    @property
    def redis(self) -> Redis: ...
    @property
    def prefix(self) -> str: ...


class TelemetryStore:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.prefix = conn.prefix
        self._script: tuple[Redis, AsyncScript] | None = None

    @property
    def redis(self) -> Redis:
        return self.conn.redis

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def raw_key(self, uuid: str) -> str:
        return self.key("raw", uuid)

    def agg_key(self, uuid: str) -> str:
        return self.key("1m", uuid)

    # ------------------------------------------------------------------ registrations

    async def register(self, data: NodeRegistered) -> None:
        """Replace the node's GPU set, its GPUs' identities and their node."""
        key = self.key("node", data.cluster, data.node)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if data.gpus:
                pipe.sadd(key, *[g.uuid for g in data.gpus])
                pipe.hset(self.key("identity"), mapping={g.uuid: g.model_dump_json() for g in data.gpus})
                pipe.hset(self.key("gpunode"), mapping={g.uuid: f"{data.cluster}/{data.node}" for g in data.gpus})
            await pipe.execute()

    async def registered_gpus(self, cluster: str, node: str) -> set[str]:
        return _strs(await self.redis.smembers(self.key("node", cluster, node)))

    async def identities(self) -> dict[str, GpuIdentity]:
        raw = _map(await self.redis.hgetall(self.key("identity")))
        return {u: GpuIdentity.model_validate_json(v) for u, v in raw.items()}

    async def knows_gpu(self, uuid: str) -> bool:
        return bool(await self.redis.hexists(self.key("gpunode"), uuid))

    # ------------------------------------------------------------------ batches

    async def last_batch(self, node_key: str) -> Last | None:
        raw = _str(await self.redis.hget(self.key("seq"), node_key))
        return decode_last(raw) if raw else None

    async def last_batches(self) -> dict[str, Last]:
        """`cluster/node` -> its last stored batch, for every node that ever sent one."""
        return {k: decode_last(v) for k, v in _map(await self.redis.hgetall(self.key("seq"))).items()}

    async def stored_batch(self, node_key: str) -> GpuTelemetry | None:
        raw = _str(await self.redis.hget(self.key("nodebatch"), node_key))
        return _telemetry(raw) if raw else None

    async def gone_gpus(self) -> set[str]:
        return _strs(await self.redis.hkeys(self.key("gone")))

    def batch_write(self, now: float, raw_retention_s: float, rollup_retention_s: float) -> BatchWrite:
        """An empty write whose rolls trim history older than the retentions at `now` (epoch seconds)."""
        return BatchWrite(self.raw_key, self.agg_key, now - raw_retention_s, now - rollup_retention_s)

    async def write(self, write: BatchWrite) -> None:
        """One script call: batches, points, XIDs, seqs, gone GPUs, rolls and trims."""
        keys, args = write.script_args(self.key("nodebatch"), self.key("lastxid"), self.key("seq"), self.key("gone"))
        redis = self.redis
        if self._script is None or self._script[0] is not redis:
            self._script = (redis, redis.register_script(STORE_SCRIPT))
        await self._script[1](keys=keys, args=args)

    # ------------------------------------------------------------------ latest samples

    async def latest(self, node: str | None = None) -> list[LatestSample]:
        """Every GPU's latest sample (optionally of one node), sorted by node and index."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key("nodebatch"))
            pipe.hgetall(self.key("gone"))
            batches, gone = await pipe.execute()
        out = [LatestSample.model_validate_json(raw) for raw in gone.values()]
        for node_key, raw in batches.items():
            if node is None or node_key.split("/", 1)[1] == node:
                out += [LatestSample(**fields) for fields in samples_of(_telemetry(raw))]
        return sorted((s for s in out if node is None or s.node == node), key=lambda s: (s.node, s.gpu.index))

    async def latest_of(self, uuid: str) -> LatestSample | None:
        node_key = _str(await self.redis.hget(self.key("gpunode"), uuid))
        raw = _str(await self.redis.hget(self.key("nodebatch"), node_key)) if node_key else None
        for fields in samples_of(_telemetry(raw)) if raw else []:
            if fields["gpu"].uuid == uuid:
                return LatestSample(**fields)
        gone = _str(await self.redis.hget(self.key("gone"), uuid))
        return LatestSample.model_validate_json(gone) if gone else None

    async def last_xids(self) -> dict[str, int]:
        return {u: int(x) for u, x in _map(await self.redis.hgetall(self.key("lastxid"))).items()}

    async def last_xid(self, uuid: str) -> int | None:
        raw = _str(await self.redis.hget(self.key("lastxid"), uuid))
        return int(raw) if raw else None

    # ------------------------------------------------------------------ history

    async def points(self, uuids: list[str], since: float, until: float) -> dict[str, list[Point]]:
        """Raw points of each GPU sampled in [since, until]."""
        rows = await self._ranges([self.raw_key(u) for u in uuids], since, until)
        return {u: [Point.decode(r) for r in rs] for u, rs in zip(uuids, rows, strict=True)}

    async def rollups(self, uuids: list[str], since: float, until: float) -> dict[str, list[Rollup]]:
        """Minute rollups of each GPU whose minute starts in [since, until]."""
        rows = await self._ranges([self.agg_key(u) for u in uuids], since, until)
        return {u: [Rollup.decode(r) for r in rs] for u, rs in zip(uuids, rows, strict=True)}

    async def _ranges(self, keys: list[str], since: float, until: float) -> list[list[str]]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.zrangebyscore(k, since, until)
            return list(await pipe.execute()) if keys else []

    # ------------------------------------------------------------------ job runs

    async def run(self, job_id: str) -> JobRun | None:
        raw = _map(await self.redis.hgetall(self.key("job", job_id)))
        return _decode_run(raw) if raw else None

    async def save_run(self, job_id: str, before: JobRun, after: JobRun, holds: HolderChange | None,
                       settle: bool) -> None:
        """Store the run as `after` (it was read as `before`) and what the GPU-holder fold changed, in one
        transaction; with `settle`, the run's usage is to be settled."""
        key = self.key("job", job_id)
        fields = _encode_run(after)
        cleared = sorted(set(_encode_run(before)) - set(fields))
        async with self.redis.pipeline(transaction=True) as pipe:
            if fields:
                pipe.hset(key, mapping={k: v for k, v in fields.items()})
            if cleared:
                pipe.hdel(key, *cleared)
            if holds is not None:
                pipe.hset(self.key("holds"), job_id, holds.job.encode())
                if holds.hold:
                    pipe.hset(self.key("holder"), mapping={g: h.encode() for g, h in holds.hold.items()})
                if holds.release:
                    pipe.hdel(self.key("holder"), *holds.release)
            if settle:
                pipe.sadd(self.key("jobs", "unsettled"), job_id)
            await pipe.execute()

    async def job_holds(self, job_id: str) -> JobHolds:
        raw = _str(await self.redis.hget(self.key("holds"), job_id))
        return JobHolds.decode(raw) if raw else JobHolds()

    async def holders_of(self, uuids: Iterable[str]) -> dict[str, Holder]:
        """The part of a job attempt holding each of these GPUs now (GPUs nobody holds are left out)."""
        wanted = list(uuids)
        raw = await self.redis.hmget(self.key("holder"), wanted) if wanted else []
        return {u: Holder.decode(cast(str, h)) for u, h in zip(wanted, raw, strict=True) if h}

    async def holders(self) -> dict[str, Holder]:
        """GPU uuid -> the part of a job attempt holding it now."""
        return {u: Holder.decode(h) for u, h in _map(await self.redis.hgetall(self.key("holder"))).items()}

    async def job_refs(self, job_ids: list[str]) -> dict[str, JobRef]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for j in job_ids:
                pipe.hmget(self.key("job", j), ["name", "team", "project"])
            rows = await pipe.execute() if job_ids else []
        return {j: JobRef(job_id=j, name=r[0], team=r[1], project=r[2]) for j, r in zip(job_ids, rows, strict=True)}

    async def settle(self, job_id: str, usage: JobUsage) -> None:
        """Keep the ended run's usage (it outlives the raw history)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("job", job_id), "usage", usage.model_dump_json())
            pipe.srem(self.key("jobs", "unsettled"), job_id)
            await pipe.execute()

    async def unsettled(self) -> list[str]:
        """Ended runs whose usage is not stored yet."""
        return sorted(_strs(await self.redis.smembers(self.key("jobs", "unsettled"))))

    async def forget_unsettled(self, job_id: str) -> None:
        await self.redis.srem(self.key("jobs", "unsettled"), job_id)


# The connection decodes responses (decode_responses=True): what redis-py types as `bytes | str` is str.
def _str(value: bytes | str | None) -> str | None:
    return cast(str | None, value)


def _strs(values: Iterable[bytes | str]) -> set[str]:
    return cast(set[str], set(values))


def _map(values: dict[bytes | str, bytes | str]) -> dict[str, str]:
    return cast(dict[str, str], values)


def _telemetry(raw: str) -> GpuTelemetry:
    """A stored node batch (the message as received)."""
    data = decode_typed(raw.encode())[1]
    if not isinstance(data, GpuTelemetry):
        raise TypeError(f"stored node batch is a {type(data).__name__}")
    return data


def _encode_run(run: JobRun) -> dict[str, str]:
    values: dict[str, Any] = {
        "name": run.name, "team": run.team, "project": run.project, "cluster": run.cluster, "node": run.node,
        "attempt": None if run.attempt is None else str(run.attempt),
        "gpu_uuids": json.dumps(list(run.gpu_uuids)) if run.attempt is not None else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "state": run.state, "usage": run.usage.model_dump_json() if run.usage else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def _decode_run(raw: dict[str, str]) -> JobRun:
    def when(name: str) -> datetime | None:
        return datetime.fromisoformat(raw[name]) if name in raw else None

    return JobRun(
        name=raw.get("name"), team=raw.get("team"), project=raw.get("project"), cluster=raw.get("cluster"),
        node=raw.get("node"), attempt=int(raw["attempt"]) if "attempt" in raw else None,
        gpu_uuids=tuple(json.loads(raw.get("gpu_uuids", "[]"))), started_at=when("started_at"),
        finished_at=when("finished_at"), state=raw.get("state"),
        usage=JobUsage.model_validate_json(raw["usage"]) if "usage" in raw else None,
    )
