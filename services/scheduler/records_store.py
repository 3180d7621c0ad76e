"""The scheduler's Redis keys, the fenced transaction every write goes through, and the reads.

Every write is a MULTI that commits only while this replica holds the current
fencing token and works on the current state epoch (the writes themselves, with
the events they cause: `store.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from whaleflux.shared.events import NodeRegistered
from whaleflux.shared.outbox import Outbox
from whaleflux.shared.runtime import StateUnavailable

from .cache import Cache, Effect
from .leadership import Leadership, NotLeader
from .records import JobRecord, NodeCondition

# Records parsed by one read before it lets the event loop run others.
PARSES_PER_YIELD = 256

# redis-py types a reply as bytes or str; the runtime's client decodes every reply (str only).
Raw = bytes | str


def _str(reply: Raw) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def _strs(reply: Iterable[Raw]) -> list[str]:
    return [_str(r) for r in reply]


def _map(reply: Mapping[Raw, Raw]) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in reply.items()}


class RecordStore:
    """The scheduler's keys, with a read-through, write-through cache while this replica leads.

    The leader is the only writer (fenced by its token), so what it committed is what
    the store holds: job records (JSON and parsed), registrations, node conditions and
    GPU allocations are kept in memory and updated after each EXEC that changed them;
    a pass then costs what changed, not a read and parse of every job. The cache is
    exact for one (epoch, token): a wiped or rebuilt store or a new lease starts it
    afresh, and a transaction that fails (or writes through a bare `transaction()`
    whose effects it does not know) drops it, so it never holds a write that did not
    land. A standby reads Redis.
    """

    def __init__(self, redis: Redis, prefix: str, outbox: Outbox, source: str, leadership: Leadership,
                 epoch: Callable[[], str | None]):
        self.redis = redis
        self.prefix = prefix
        self.outbox = outbox
        self.source = source
        self.leadership = leadership
        # The state generation this process works on (the runtime's epoch marker): a write
        # onto a store that was wiped or replaced since is refused, never made on partial state.
        self.epoch = epoch
        self._cache: Cache | None = None

    # ------------------------------------------------------------ keys

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}:state-epoch"

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    @property
    def jobs_key(self) -> str:
        """Every job id, by submission time."""
        return f"{self.prefix}:jobs"

    @property
    def pending_key(self) -> str:
        return f"{self.prefix}:pending"

    @property
    def waiting_key(self) -> str:
        """Why each pending job waits, as of the last pass that changed it (job -> reason)."""
        return f"{self.prefix}:waiting"

    @property
    def alloc_key(self) -> str:
        return f"{self.prefix}:alloc"

    @property
    def nodes_key(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def conditions_key(self) -> str:
        return f"{self.prefix}:node-conditions"

    @property
    def seen_key(self) -> str:
        return f"{self.prefix}:heartbeats"

    # ------------------------------------------------------------ cache and transactions

    def _live(self) -> Cache | None:
        """The cache, while this replica leads on the state it works on (None: read Redis)."""
        token = self.leadership.token if self.leadership is not None else None
        if token is None:
            self._cache = None
            return None
        key = (self.epoch(), token)
        if self._cache is None or self._cache.key != key:
            self._cache = Cache(key)
        return self._cache

    def drop_cache(self) -> None:
        """Forget everything cached (after a rebuild, or writes whose effects are unknown)."""
        self._cache = None

    def _fills(self, cache: Cache | None, gen: int, part: str) -> bool:
        """Whether a read of `part` begun at `gen` may fill the cache (the part was not written, nor the cache
        replaced, meanwhile)."""
        return cache is not None and cache is self._cache and cache.fills(part, gen)

    def _apply(self, effects: list[Effect]) -> None:
        cache = self._live()
        if cache is not None:
            cache.gen += 1
            for effect in effects:
                effect(cache)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Pipeline]:
        """A MULTI that commits only while this replica's fencing token is the current one.

        WATCH on the token counter: if another replica took the lease between the
        check and EXEC, EXEC fails and nothing is written (raised as NotLeader).
        """
        async with self._transaction(None) as pipe:
            yield pipe

    @contextlib.asynccontextmanager
    async def _transaction(self, effects: list[Effect] | None) -> AsyncIterator[Pipeline]:
        """`transaction()`, and then the cache: `effects` applied once EXEC succeeded (None: unknown
        writes, the cache is dropped); any failure drops it too (a write may or may not have landed)."""
        token = self.leadership.token
        if token is None:
            raise NotLeader("this scheduler replica is a standby")
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(self.leadership.token_key, self.epoch_key)
            current, epoch = [None if r is None else _str(r) for r in await pipe.mget(self.leadership.token_key,
                                                                                          self.epoch_key)]
            if epoch is None or epoch != self.epoch():
                raise StateUnavailable("scheduler state lost (the store was wiped or replaced); rebuilding")
            if current is None or int(current) != token:
                raise NotLeader(f"fencing token {token} is stale (current {current})")
            pipe.multi()
            try:
                yield pipe
            except WatchError as exc:
                self.drop_cache()
                raise NotLeader(f"another replica took the lease (token {token} is stale)") from exc
            except BaseException:
                self.drop_cache()
                raise
        if effects is None:
            self.drop_cache()
        else:
            self._apply(effects)

    # ------------------------------------------------------------ reads

    async def job(self, job_id: str) -> JobRecord | None:
        """The job's record, the caller's own copy (it may change it before writing it back)."""
        raw = (await self._raws([job_id])).get(job_id)
        return JobRecord.model_validate_json(raw) if raw else None

    async def jobs(self, job_ids: list[str]) -> dict[str, JobRecord]:
        """Records by id (the caller's own copies); unknown ids are left out."""
        raws = await self._raws(job_ids)
        return {j: JobRecord.model_validate_json(raws[j]) for j in job_ids if j in raws}

    async def jobs_shared(self, job_ids: list[str]) -> dict[str, JobRecord]:
        """Records by id for reading only (the pass): while leading, the cache's own parsed objects,
        parsed once per write. Never change one in place; take `job()` to change a job."""
        raws = await self._raws(job_ids)
        cache = self._live()
        if cache is None:
            return {j: JobRecord.model_validate_json(raws[j]) for j in job_ids if j in raws}
        out, parses = {}, 0
        for j in job_ids:
            if j not in raws:
                continue
            parsed = cache.parsed.get(j)
            if parsed is None:
                parsed = JobRecord.model_validate_json(raws[j])
                if cache.raw.get(j) == raws[j]:
                    cache.parsed[j] = parsed
                parses += 1
                if parses % PARSES_PER_YIELD == 0:
                    # 10,000 new records are seconds of a loaded core: let the lease renewal and HTTP in.
                    await asyncio.sleep(0)
            out[j] = parsed
        return out

    async def _raws(self, job_ids: list[str]) -> dict[str, str]:
        """Each known job's JSON: from the cache, the rest from Redis (and into the cache)."""
        cache = self._live()
        if cache is None:
            missing, out = list(job_ids), {}
        else:
            out = {j: cache.raw[j] for j in job_ids if j in cache.raw}
            missing = [j for j in job_ids if j not in out]
        if missing:
            gen = cache.gen if cache is not None else 0
            raws = await self.redis.mget([self.job_key(j) for j in missing])
            found = {j: _str(r) for j, r in zip(missing, raws, strict=True) if r}
            out.update(found)
            if cache is not None and cache is self._cache:
                cache.raw.update({j: raw for j, raw in found.items() if cache.fills(f"job:{j}", gen)})
        return out

    async def pending_ids(self) -> list[str]:
        """The queue, in submission order."""
        return _strs(cast(list[Raw], await self.redis.zrange(self.pending_key, 0, -1)))

    async def newest_job_ids(self, start: int, count: int) -> list[str]:
        """Job ids, newest submission first, from position `start`."""
        return _strs(cast(list[Raw], await self.redis.zrevrange(self.jobs_key, start, start + count - 1)))

    async def with_waiting(self, jobs: list[JobRecord]) -> list[JobRecord]:
        """Pending jobs with the last pass's reason and their place in line (by submission), for reading."""
        pending = [j for j in jobs if j.state == "pending"]
        if not pending:
            return jobs
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self.waiting_key, [j.job_id for j in pending])
            for j in pending:
                pipe.zrank(self.pending_key, j.job_id)
            reasons, *ranks = await pipe.execute()
        for job, why, rank in zip(pending, reasons, ranks, strict=True):
            if why:
                ahead = "first in line" if not rank else f"{rank} job(s) submitted before it still wait"
                job.reason = f"{why}; {ahead}"
        return jobs

    async def registrations(self) -> dict[str, NodeRegistered]:
        """`cluster/node` -> its registration (read only: shared with the cache)."""
        cache = self._live()
        if cache is not None and cache.regs is not None:
            return dict(cache.regs)
        gen = cache.gen if cache is not None else 0
        raw = _map(await self.redis.hgetall(self.nodes_key))
        regs = {k: NodeRegistered.model_validate_json(v) for k, v in raw.items()}
        if cache is not None and self._fills(cache, gen, "regs"):
            cache.regs = dict(regs)
        return regs

    async def registration(self, node_key: str) -> NodeRegistered | None:
        """One node's registration (read only: shared with the cache; no copy of them all, per heartbeat)."""
        cache = self._live()
        if cache is not None and cache.regs is not None:
            return cache.regs.get(node_key)
        return (await self.registrations()).get(node_key)

    async def registered(self, node_key: str) -> bool:
        return await self.registration(node_key) is not None

    async def node_keys(self) -> list[str]:
        """Every registered node's `cluster/node`."""
        return _strs(await self.redis.hkeys(self.nodes_key))

    async def conditions(self) -> dict[str, NodeCondition]:
        cache = self._live()
        if cache is not None and cache.conditions is not None:
            return dict(cache.conditions)
        gen = cache.gen if cache is not None else 0
        raw = _map(await self.redis.hgetall(self.conditions_key))
        conditions = {k: NodeCondition.model_validate_json(v) for k, v in raw.items()}
        if cache is not None and self._fills(cache, gen, "conditions"):
            cache.conditions = dict(conditions)
        return conditions

    async def last_seen(self) -> dict[str, float]:
        return {k: float(v) for k, v in _map(await self.redis.hgetall(self.seen_key)).items()}

    async def alloc(self) -> dict[str, str]:
        """GPU uuid -> the job holding it."""
        cache = self._live()
        if cache is not None and cache.alloc is not None:
            return dict(cache.alloc)
        gen = cache.gen if cache is not None else 0
        alloc = _map(await self.redis.hgetall(self.alloc_key))
        if cache is not None and self._fills(cache, gen, "alloc"):
            cache.alloc = dict(alloc)
        return dict(alloc)

    async def jobs_on(self, node_key: str) -> list[JobRecord]:
        """Jobs holding GPUs of the node (`cluster/node`)."""
        reg = await self.registration(node_key)
        if reg is None:
            return []
        cache = self._live()
        alloc = cache.alloc if cache is not None and cache.alloc is not None else await self.alloc()
        ids = sorted({alloc[g.uuid] for g in reg.gpus if g.uuid in alloc})
        return [j for j in (await self.jobs(ids)).values() if j.state in ("placed", "running")]

    # ------------------------------------------------------------ writes outside transactions

    async def set_waiting(self, changed: dict[str, str], gone: list[str]) -> None:
        """Store only the reasons that changed since the last pass, in one round trip."""
        if not changed and not gone:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            if changed:
                pipe.hset(self.waiting_key, mapping={k: v for k, v in changed.items()})
            if gone:
                pipe.hdel(self.waiting_key, *gone)
            await pipe.execute()

    async def record_heard(self, node_key: str, at: float) -> None:
        """When a node's heartbeat arrived (epoch s). Not fenced: a fact about the node, harmless from any
        replica (and read by standbys)."""
        await self.redis.hset(self.seen_key, node_key, at)
