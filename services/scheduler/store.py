"""The scheduler's Redis state, and the transactions that change it together with the events they cause.

Every state change that others must hear about stages its event in the
outbox inside the same MULTI, with an id fixed by (job, attempt), so a crash
neither loses nor doubles it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from whaleflux.shared import subjects
from whaleflux.shared.events import (
    EventData,
    JobPlaced,
    JobPreempted,
    JobRejected,
    JobRequeued,
    NodeRegistered,
    make_envelope,
)
from whaleflux.shared.outbox import Outbox
from whaleflux.shared.service import StateUnavailable

from .gang import parts_of
from .history import back_to_queue
from .leadership import Leadership, NotLeader
from .placement import Placement
from .records import JobPart, JobRecord, NodeCondition


@dataclass
class _Cache:
    """What this leader knows the store holds, parsed (see `SchedulerStore`): exact for one (epoch, token)."""

    key: tuple[str | None, int]
    raw: dict[str, str] = field(default_factory=dict)  # job id -> its record's JSON as stored
    parsed: dict[str, JobRecord] = field(default_factory=dict)  # shared with the pass: never changed in place
    regs: dict[str, NodeRegistered] | None = None
    conditions: dict[str, NodeCondition] | None = None
    alloc: dict[str, str] | None = None
    # Bumped by every committed write: a read from Redis fills the cache only if nothing was written
    # meanwhile (its answer might predate that write).
    gen: int = 0


Effect = Callable[[_Cache], None]


def part_event_id(kind: str, job_id: str, attempt: int, rank: int) -> str:
    """The outbox id of an event about one part of an attempt: rank 0 (and a one-node job) keeps the plain id."""
    return f"{kind}-{job_id}-{attempt}" + (f"-r{rank}" if rank else "")


class SchedulerStore:
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
        # The state generation this process works on (ServiceBase's epoch marker): a write
        # onto a store that was wiped or replaced since is refused, never made on partial state.
        self.epoch = epoch
        self._cache: _Cache | None = None

    # ------------------------------------------------------------ cache

    def _live(self) -> _Cache | None:
        """The cache, while this replica leads on the state it works on (None: read Redis)."""
        token = self.leadership.token if self.leadership is not None else None
        if token is None:
            self._cache = None
            return None
        key = (self.epoch(), token)
        if self._cache is None or self._cache.key != key:
            self._cache = _Cache(key)
        return self._cache

    def drop_cache(self) -> None:
        """Forget everything cached (after a rebuild, or writes whose effects are unknown)."""
        self._cache = None

    def _apply(self, effects: list[Effect]) -> None:
        cache = self._live()
        if cache is not None:
            cache.gen += 1
            for effect in effects:
                effect(cache)

    @staticmethod
    def _job_written(job_id: str, raw: str) -> Effect:
        def effect(c: _Cache) -> None:
            c.raw[job_id] = raw
            c.parsed.pop(job_id, None)  # parsed again when a pass needs it
        return effect

    @staticmethod
    def _job_unknown(job_id: str) -> Effect:
        def effect(c: _Cache) -> None:
            c.raw.pop(job_id, None)
            c.parsed.pop(job_id, None)
        return effect

    @staticmethod
    def _alloc_set(gpus: list[str], job_id: str | None) -> Effect:
        def effect(c: _Cache) -> None:
            if c.alloc is not None:
                for gpu in gpus:
                    if job_id is None:
                        c.alloc.pop(gpu, None)
                    else:
                        c.alloc[gpu] = job_id
        return effect

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
            current, epoch = await pipe.mget(self.leadership.token_key, self.epoch_key)
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

    # ------------------------------------------------------------ keys

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}:state-epoch"

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

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
        out = {}
        for j in job_ids:
            if j not in raws:
                continue
            parsed = cache.parsed.get(j)
            if parsed is None:
                parsed = JobRecord.model_validate_json(raws[j])
                if cache.raw.get(j) == raws[j]:
                    cache.parsed[j] = parsed
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
            found = {j: r for j, r in zip(missing, raws) if r}
            out.update(found)
            if cache is not None and cache is self._cache and cache.gen == gen:
                cache.raw.update(found)
        return out

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
        for job, why, rank in zip(pending, reasons, ranks):
            if why:
                ahead = "first in line" if not rank else f"{rank} job(s) submitted before it still wait"
                job.reason = f"{why}; {ahead}"
        return jobs

    async def set_waiting(self, changed: dict[str, str], gone: list[str]) -> None:
        """Store only the reasons that changed since the last pass, in one round trip."""
        if not changed and not gone:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            if changed:
                pipe.hset(self.waiting_key, mapping=changed)
            if gone:
                pipe.hdel(self.waiting_key, *gone)
            await pipe.execute()

    async def registrations(self) -> dict[str, NodeRegistered]:
        """`cluster/node` -> its registration (read only: shared with the cache)."""
        cache = self._live()
        if cache is not None and cache.regs is not None:
            return dict(cache.regs)
        gen = cache.gen if cache is not None else 0
        raw = await self.redis.hgetall(self.nodes_key)
        regs = {k: NodeRegistered.model_validate_json(v) for k, v in raw.items()}
        if cache is not None and cache is self._cache and cache.gen == gen:
            cache.regs = dict(regs)
        return regs

    async def registered(self, node_key: str) -> bool:
        return node_key in await self.registrations()

    async def conditions(self) -> dict[str, NodeCondition]:
        cache = self._live()
        if cache is not None and cache.conditions is not None:
            return dict(cache.conditions)
        gen = cache.gen if cache is not None else 0
        raw = await self.redis.hgetall(self.conditions_key)
        conditions = {k: NodeCondition.model_validate_json(v) for k, v in raw.items()}
        if cache is not None and cache is self._cache and cache.gen == gen:
            cache.conditions = dict(conditions)
        return conditions

    async def last_seen(self) -> dict[str, float]:
        return {k: float(v) for k, v in (await self.redis.hgetall(self.seen_key)).items()}

    async def alloc(self) -> dict[str, str]:
        """GPU uuid -> the job holding it."""
        cache = self._live()
        if cache is not None and cache.alloc is not None:
            return dict(cache.alloc)
        gen = cache.gen if cache is not None else 0
        alloc = await self.redis.hgetall(self.alloc_key)
        if cache is not None and cache is self._cache and cache.gen == gen:
            cache.alloc = dict(alloc)
        return alloc

    async def jobs_on(self, node_key: str) -> list[JobRecord]:
        """Jobs holding GPUs of the node (`cluster/node`)."""
        reg = (await self.registrations()).get(node_key)
        if reg is None:
            return []
        cache = self._live()
        alloc = cache.alloc if cache is not None and cache.alloc is not None else await self.alloc()
        ids = sorted({alloc[g.uuid] for g in reg.gpus if g.uuid in alloc})
        return [j for j in (await self.jobs(ids)).values() if j.state in ("placed", "running")]

    # ------------------------------------------------------------ writes

    def _set_job(self, pipe: Pipeline, job: JobRecord, effects: list[Effect]) -> None:
        raw = job.model_dump_json()
        pipe.set(self.job_key(job.job_id), raw)
        effects.append(self._job_written(job.job_id, raw))

    async def save(self, job: JobRecord) -> None:
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            await pipe.execute()

    async def submit(self, jobs: list[JobRecord]) -> None:
        """Record and queue new jobs in one MULTI; a job id already known is recorded once (the first wins)."""
        if not jobs:
            return
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            for job in jobs:
                # SET NX: what it leaves is known only after EXEC: the cache reads it again if asked.
                pipe.set(self.job_key(job.job_id), job.model_dump_json(), nx=True)
                pipe.zadd(f"{self.prefix}:jobs", {job.job_id: job.submitted_at.timestamp()}, nx=True)
                pipe.zadd(self.pending_key, {job.job_id: job.submitted_at.timestamp()}, nx=True)
                effects.append(self._job_unknown(job.job_id))
            results = await pipe.execute()
        # A duplicate whose first submission has moved on must not stay queued (also repairs a crash of
        # an older scheduler between recording and queueing).
        dups = [job.job_id for job, created in zip(jobs, results[::3]) if not created]
        if dups:
            stale = [j for j, rec in (await self.jobs(dups)).items() if rec.state != "pending"]
            await self.unqueue(stale)

    async def unqueue(self, job_ids: list[str]) -> None:
        """Take ids out of the pending queue (jobs no longer pending)."""
        if job_ids:
            async with self._transaction([]) as pipe:
                pipe.zrem(self.pending_key, *job_ids)
                await pipe.execute()

    async def finish(self, job: JobRecord, unqueue: bool = False) -> None:
        """The job's record as it ends (or goes back to the queue), its GPUs released."""
        effects: list[Effect] = [self._alloc_set(list(job.gpu_uuids), None)]
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            for gpu in job.gpu_uuids:
                pipe.hdel(self.alloc_key, gpu)
            if unqueue:
                pipe.zrem(self.pending_key, job.job_id)
            await pipe.execute()

    def _envelope(self, data: EventData, event_id: str, job_id: str, time: datetime | None = None):
        return make_envelope(data, source=self.source, subject=job_id, event_id=event_id, correlation_id=job_id, time=time)

    def _placed(self, job: JobRecord, p: Placement, now: datetime, expected_end: float | None) -> list[tuple[str, object]]:
        """The job's record as placed (changed in place) and its job.placed events (one per node of a gang)."""
        job.attempt += 1
        job.state, job.reason, job.placed_at = "placed", None, now
        job.parts = parts_of(p)
        job.cluster, job.node, job.gpu_model = p.cluster, p.node, p.model
        job.gpu_uuids = [u for s in p.shares for u in s.gpu_uuids]
        job.started_at = job.finished_at = job.exit_code = job.held_until = None
        job.placed_because, job.expected_end = p.explanation or None, expected_end
        spec = job.spec
        gang = [s.node for s in p.shares] if job.parts else None
        events = []
        for rank, share in enumerate(p.shares):
            event = JobPlaced(
                job_id=job.job_id,
                attempt=job.attempt,
                cluster=share.cluster,
                node=share.node,
                gpu_model=share.model,
                gpu_uuids=list(share.gpu_uuids),
                gpu_indices=list(share.gpu_indices),
                command=spec.command,
                env=spec.env,
                workdir=spec.workdir,
                team=spec.team,
                project=spec.project,
                checkpoint_dir=spec.checkpoint_dir,
                # A later attempt resumes from the checkpoint unless the job asked to start over.
                resume=job.attempt > 1 and spec.resume == "checkpoint",
                rank=rank if gang else None,
                gang_nodes=gang,
                gang_gpus=len(job.gpu_uuids) if gang else None,
            )
            event_id = part_event_id("placed", job.job_id, job.attempt, rank)
            events.append((subjects.job_placed(share.cluster, share.node), self._envelope(event, event_id, job.job_id, now)))
        return events

    async def commit_placements(self, placements: list[tuple[JobRecord, Placement, float | None]], now: datetime) -> None:
        """Every placement of a pass in one MULTI: each job placed, its GPUs held and its job.placed staged."""
        if not placements:
            return
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            for job, p, expected_end in placements:
                events = self._placed(job, p, now, expected_end)
                self._set_job(pipe, job, effects)
                pipe.zrem(self.pending_key, job.job_id)
                pipe.hset(self.alloc_key, mapping={gpu: job.job_id for gpu in job.gpu_uuids})
                effects.append(self._alloc_set(list(job.gpu_uuids), job.job_id))
                for subject, env in events:
                    self.outbox.stage(pipe, subject, env)
            await pipe.execute()

    def _stop_orders(self, pipe: Pipeline, job: JobRecord, parts: list[tuple[int, str, str]], reason: str,
                     grace_s: float, now: datetime, kind: str = "preempted") -> None:
        """Stage a job.preempted stop order to each (rank, cluster, node) of the current attempt."""
        for rank, cluster, node in parts:
            order = JobPreempted(job_id=job.job_id, attempt=job.attempt, cluster=cluster, node=node, reason=reason, grace_s=grace_s)
            event_id = part_event_id(kind, job.job_id, job.attempt, rank)
            self.outbox.stage(pipe, subjects.job_preempted(cluster, node), self._envelope(order, event_id, job.job_id, now))

    async def end(self, job: JobRecord, stop: list[JobPart], reason: str, grace_s: float, now: datetime) -> None:
        """The job reached a terminal state: record saved, GPUs released, and the parts still
        running of a failed gang told to stop (they must not run on as half a job)."""
        effects: list[Effect] = [self._alloc_set(list(job.gpu_uuids), None)]
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            for gpu in job.gpu_uuids:
                pipe.hdel(self.alloc_key, gpu)
            self._stop_orders(pipe, job, [(p.rank, p.cluster, p.node) for p in stop], reason, grace_s, now, "stopped")
            await pipe.execute()

    async def reject(self, job: JobRecord, reason: str) -> None:
        """A job that can never run is rejected with its reason, never queued forever."""
        job.state, job.reason = "rejected", reason
        env = self._envelope(JobRejected(job_id=job.job_id, reason=reason), f"rejected-{job.job_id}", job.job_id)
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            pipe.zrem(self.pending_key, job.job_id)
            self.outbox.stage(pipe, subjects.JOB_REJECTED, env)
            await pipe.execute()

    async def requeue(self, job: JobRecord, cause: str, reason: str, now: datetime, stop_grace_s: float | None,
                      spare: frozenset[int] = frozenset(), hold_until: datetime | None = None, moved: bool = False) -> None:
        """Back to the queue at its original place; GPUs released; job.requeued staged.

        `hold_until`: the job is not placed again before its stopped attempt reports its
        end, or that time (never two copies while the old one is in its grace period).
        `moved`: the queue policy moved the job (cause `preempted`, counted in
        `migrations`, not `preemptions`).

        With `stop_grace_s`, a job.preempted stop order goes to the node first
        (before any placement that reuses the GPUs, since the outbox keeps order):
        to every node of a gang, except the ranks in `spare` (their parts ended).
        It is sent even to a lost node: its agent finds it in its consumer when it
        comes back, and stops the old attempt rather than run it twice.
        """
        attempt, cluster, node = job.attempt, job.cluster, job.node
        held = list(job.gpu_uuids)
        parts = [(p.rank, p.cluster, p.node) for p in job.parts] or [(0, cluster, node)]
        gang = [p.node for p in job.parts] or None
        where = f"{node}" if not gang else f"{', '.join(gang)} (gang)"
        back_to_queue(job, f"attempt {attempt} on {where}: {reason}", reason, "" if moved else cause, hold_until)
        if hold_until is not None:
            job.reason += f"; placed again once attempt {attempt} has stopped on {where}"
        if moved:
            job.migrations += 1
            job.reason = f"moved: {job.reason.removeprefix('requeued: ')}"
        requeued = JobRequeued(job_id=job.job_id, attempt=attempt, cluster=cluster, node=node, reason=reason, cause=cause,
                               gang_nodes=gang)
        effects: list[Effect] = [self._alloc_set(held, None)]
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            for gpu in held:
                pipe.hdel(self.alloc_key, gpu)
            pipe.zadd(self.pending_key, {job.job_id: job.submitted_at.timestamp()})
            if stop_grace_s is not None:
                self._stop_orders(pipe, job, [p for p in parts if p[0] not in spare], reason, stop_grace_s, now)
            self.outbox.stage(pipe, subjects.JOB_REQUEUED, self._envelope(requeued, f"requeued-{job.job_id}-{attempt}", job.job_id, now))
            await pipe.execute()

    async def set_condition(self, node_key: str, condition: NodeCondition | None) -> None:
        def effect(c: _Cache) -> None:
            if c.conditions is not None:
                if condition is None:
                    c.conditions.pop(node_key, None)
                else:
                    c.conditions[node_key] = condition
        async with self._transaction([effect]) as pipe:
            if condition is None:
                pipe.hdel(self.conditions_key, node_key)
            else:
                pipe.hset(self.conditions_key, node_key, condition.model_dump_json())
            await pipe.execute()

    async def register(self, reg: NodeRegistered) -> None:
        """A node's registration (overwrites the previous one)."""
        key = f"{reg.cluster}/{reg.node}"

        def effect(c: _Cache) -> None:
            if c.regs is not None:
                c.regs[key] = reg
        async with self._transaction([effect]) as pipe:
            pipe.hset(self.nodes_key, key, reg.model_dump_json())
            await pipe.execute()
