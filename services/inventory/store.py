"""Inventory's Redis state (`wf:inventory`): every key and encoding the service uses, and nothing else does.

The keys are listed in docs/services/inventory.md. The declarations document
is kept by the shared `StoredConfig` under `declarations`; lease events are
staged in the shared outbox in the same transaction that marks them fired.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Protocol, cast

import structlog
from redis.asyncio import Redis
from redis.exceptions import WatchError

from whaleflux.shared.configstore import StoredConfig
from whaleflux.shared.contracts import Holder, HolderChange, JobHolds
from whaleflux.shared.events import Envelope
from whaleflux.shared.outbox import Outbox

from .assets import Declarations, parse_declarations
from .discovery import NodeRecord
from .findings import QueuedJob, Validation
from .rollups import HOUR, Allocation, UtilSums, hour_floor


class Connection(Protocol):
    """Where the store finds its Redis and outbox (the service runtime: connected after start-up)."""

    @property
    def redis(self) -> Redis: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def prefix(self) -> str: ...


# The fields of a GPU's hourly utilization sums (`util:<hour>`): `<uuid>|<part>`.
_UTIL_PARTS = {"as": "allocated_sum", "an": "allocated_n", "s": "total_sum", "n": "total_n"}
# A node's batch is added once: only if newer than the last one added for the node (`util:last`), in the same
# call, so a batch that comes again (handled, then the replica died before its ack) is not counted twice.
_ADD_UTIL = """
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '-1')
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
for i = 4, #ARGV, 5 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i] .. '|as', ARGV[i + 1])
  redis.call('HINCRBY', KEYS[1], ARGV[i] .. '|an', ARGV[i + 2])
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i] .. '|s', ARGV[i + 3])
  redis.call('HINCRBY', KEYS[1], ARGV[i] .. '|n', ARGV[i + 4])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class InventoryStore:
    def __init__(self, conn: Connection, clock: Callable[[], datetime], log: structlog.typing.FilteringBoundLogger):
        self.conn = conn
        self.prefix = conn.prefix
        self.clock = clock
        self.log = log
        self._declared: tuple[Redis, StoredConfig[Declarations]] | None = None

    @property
    def redis(self) -> Redis:
        return self.conn.redis

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # ------------------------------------------------------------------ nodes

    async def node(self, cluster: str, node: str) -> NodeRecord | None:
        raw = _str(await self.redis.hget(self.key("nodes"), f"{cluster}/{node}"))
        return NodeRecord.model_validate_json(raw) if raw else None

    async def save_node(self, record: NodeRecord) -> None:
        await self.redis.hset(self.key("nodes"), f"{record.cluster}/{record.node}", record.model_dump_json())

    async def nodes(self) -> list[NodeRecord]:
        raw = _map(await self.redis.hgetall(self.key("nodes")))
        return [NodeRecord.model_validate_json(v) for v in raw.values()]

    async def node_count(self) -> int:
        return int(await self.redis.hlen(self.key("nodes")))

    # ------------------------------------------------------------------ the scheduler's cordons (gpu.cordoned)

    async def set_cordon(self, uuid: str, cause: str | None) -> None:
        """A GPU the scheduler cordoned or quarantined, and why (`cause`; None: it takes work again)."""
        if cause is None:
            await self.redis.hdel(self.key("cordons"), uuid)
        else:
            await self.redis.hset(self.key("cordons"), uuid, cause)

    async def cordons(self) -> dict[str, str]:
        """GPU uuid -> why the scheduler keeps it out (operator, xid, ecc, missing)."""
        return _map(await self.redis.hgetall(self.key("cordons")))

    # ------------------------------------------------------------------ drained nodes (node.drain_requested)

    async def set_drain(self, cluster: str, node: str, reason: str | None) -> None:
        """A node asked to drain, and why (None: undrained, it takes work again)."""
        if reason is None:
            await self.redis.hdel(self.key("drains"), f"{cluster}/{node}")
        else:
            await self.redis.hset(self.key("drains"), f"{cluster}/{node}", reason)

    async def drains(self) -> dict[str, str]:
        """"cluster/node" -> why it drains."""
        return _map(await self.redis.hgetall(self.key("drains")))

    # ------------------------------------------------------------------ burn-ins (gpu.validated)

    async def save_validation(self, v: Validation) -> None:
        """A GPU's burn-in, unless the one stored is newer (a replayed event never goes back in time)."""
        old = await self.validations([v.uuid])
        if old and old[0].at >= v.at:
            return
        doc = {"cluster": v.cluster, "node": v.node, "index": v.index, "verdict": v.verdict, "at": v.at.isoformat(),
               "reasons": list(v.reasons)}
        await self.redis.hset(self.key("validation"), v.uuid, json.dumps(doc))

    async def validations(self, uuids: Iterable[str] | None = None) -> list[Validation]:
        """The last burn-in of these GPUs (all when None) that have one."""
        if uuids is None:
            raw = _map(await self.redis.hgetall(self.key("validation")))
        else:
            wanted = list(uuids)
            values = await self.redis.hmget(self.key("validation"), wanted) if wanted else []
            raw = {u: cast(str, v) for u, v in zip(wanted, values, strict=True) if v is not None}
        out = []
        for uuid, text in raw.items():
            d = json.loads(text)
            out.append(Validation(uuid, d["cluster"], d["node"], d["index"], d["verdict"],
                                  datetime.fromisoformat(d["at"]), tuple(d["reasons"])))
        return out

    # ------------------------------------------------------------------ queued jobs

    async def queue(self, job: QueuedJob) -> None:
        """Remember a submitted job (the first submission of an id wins)."""
        doc = {"gpus": job.gpus, "models": list(job.models), "expected_runtime_s": job.expected_runtime_s}
        await self.redis.hsetnx(self.key("queued"), job.job_id, json.dumps(doc))

    async def dequeue(self, job_id: str) -> None:
        await self.redis.hdel(self.key("queued"), job_id)

    async def queued(self) -> list[QueuedJob]:
        """Jobs submitted and not yet placed or rejected, by id."""
        raw = _map(await self.redis.hgetall(self.key("queued")))
        return [
            QueuedJob(job_id, q["gpus"], tuple(q["models"]), q["expected_runtime_s"])
            for job_id, q in sorted((k, json.loads(v)) for k, v in raw.items())
        ]

    # ------------------------------------------------------------------ allocations

    async def open_allocation(self, alloc: Allocation) -> None:
        """Record an allocation's start (for the rollups; who holds a GPU now is the holder fold's)."""
        record = json.dumps({"gpus": list(alloc.gpu_uuids), "start": alloc.start.isoformat()})
        await self.redis.hset(self.key("alloc:start"), alloc.key, record)

    async def close_allocation(self, key: str, end: datetime) -> None:
        """Record an allocation's end."""
        await self.redis.hset(self.key("alloc:end"), key, end.isoformat())

    # ------------------------------------------------------------------ GPU holders (shared.contracts.holders)

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

    async def save_holds(self, job_id: str, change: HolderChange) -> None:
        """The job's new holds and its GPUs held and released, in one transaction."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key("holds"), job_id, change.job.encode())
            if change.hold:
                pipe.hset(self.key("holder"), mapping={g: h.encode() for g, h in change.hold.items()})
            if change.release:
                pipe.hdel(self.key("holder"), *change.release)
            await pipe.execute()

    async def allocations(self) -> list[Allocation]:
        starts = _map(await self.redis.hgetall(self.key("alloc:start")))
        ends = _map(await self.redis.hgetall(self.key("alloc:end")))
        out = []
        for key, raw in starts.items():
            rec = json.loads(raw)
            end = datetime.fromisoformat(ends[key]) if key in ends else None
            out.append(Allocation(key, tuple(rec["gpus"]), datetime.fromisoformat(rec["start"]), end))
        return out

    async def has_allocation(self, key: str, ended: bool = False) -> bool:
        """Whether the allocation's start (or, with `ended`, its end) is recorded."""
        return bool(await self.redis.hexists(self.key("alloc:end" if ended else "alloc:start"), key))

    async def prune_allocations(self, cutoff: datetime) -> int:
        """Forget allocations that ended before `cutoff`; return how many."""
        ends = _map(await self.redis.hgetall(self.key("alloc:end")))
        old = [key for key, t in ends.items() if datetime.fromisoformat(t) < cutoff]
        if old:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self.key("alloc:start"), *old)
                pipe.hdel(self.key("alloc:end"), *old)
                await pipe.execute()
        return len(old)

    # ------------------------------------------------------------------ utilization

    def _util_key(self, hour: datetime) -> str:
        return self.key(f"util:{int(hour.timestamp())}")

    async def add_utilization(self, node_key: str, sample_time: datetime, sums: dict[str, UtilSums],
                              ttl_s: int) -> bool:
        """Add one node's telemetry batch's per-GPU sums to its hour's (kept `ttl_s`), unless the node's last batch
        added is as new or newer (this one came again); whether it was added."""
        hour = hour_floor(sample_time)
        args: list[str | int | float] = [node_key, int(sample_time.timestamp() * 1_000_000), ttl_s]
        for uuid, s in sums.items():
            args += [uuid, s.allocated_sum, s.allocated_n, s.total_sum, s.total_n]
        added = await self.redis.eval(_ADD_UTIL, 2, self._util_key(hour), self.key("util:last"), *args)
        return bool(added)

    async def utilization(self, start: datetime, end: datetime) -> dict[tuple[str, datetime], UtilSums]:
        """Per (GPU, hour) sums of the hours overlapping [start, end)."""
        hours = []
        h = hour_floor(start)
        while h < end:
            hours.append(h)
            h += HOUR
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in hours:
                pipe.hgetall(self._util_key(h))
            results = await pipe.execute()
        out: dict[tuple[str, datetime], UtilSums] = {}
        for h, fields in zip(hours, results, strict=True):
            for name, value in fields.items():
                uuid, part = name.rsplit("|", 1)
                s = out.setdefault((uuid, h), UtilSums())
                attr = _UTIL_PARTS[part]
                setattr(s, attr, float(value) if attr.endswith("_sum") else int(value))
        return out

    # ------------------------------------------------------------------ declarations

    @property
    def declared(self) -> StoredConfig[Declarations]:
        """The declarations document (file or upload; the last good one stays in force)."""
        redis = self.redis
        if self._declared is None or self._declared[0] is not redis:
            config = StoredConfig(redis, self.key("declarations"), parse_declarations, self.clock, self.log, "assets")
            self._declared = (redis, config)
        return self._declared[1]

    async def declaration_source(self) -> tuple[str | None, str | None]:
        """Where the declarations in force came from, and when they were applied."""
        source, applied_at = await self.redis.hmget(self.key("declarations"), ["source", "applied_at"])
        return _str(source), _str(applied_at)

    # ------------------------------------------------------------------ lease notices

    async def stage_notices(self, decide: Callable[[set[str]], tuple[list[str], list[tuple[str, Envelope]]]]) -> bool:
        """Mark notices fired and stage their events in one transaction.

        `decide(fired ids)` returns the ids to mark and the (subject, envelope) to stage. Under WATCH:
        two replicas checking at once stage each notice only once. False: nothing to do, or another
        replica got there first (the next check sees its work).
        """
        key = self.key("lease:fired")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                fired = _strs(await pipe.smembers(key))
                done, events = decide(fired)
                if not done:
                    return False
                pipe.multi()
                pipe.sadd(key, *done)
                for subject, env in events:
                    self.conn.outbox.stage(pipe, subject, env)
                await pipe.execute()
        except WatchError:
            return False
        return True


# The connection decodes responses (decode_responses=True): what redis-py types as `bytes | str` is str.
def _str(value: bytes | str | None) -> str | None:
    return cast(str | None, value)


def _strs(values: Iterable[bytes | str]) -> set[str]:
    return cast(set[str], set(values))


def _map(values: Any) -> dict[str, str]:
    return cast(dict[str, str], values)
