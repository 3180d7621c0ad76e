"""The scheduler's state changes, each in one fenced transaction together with the events it causes.

Every state change that others must hear about stages its event in the
outbox inside the same MULTI, with an id fixed by (job, attempt), so a crash
neither loses nor doubles it (the events themselves: `transitions.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from redis.asyncio.client import Pipeline

from whaleflux.shared import subjects
from whaleflux.shared.events import NodeRegistered, NodeUndrained, make_envelope

from . import cache as fx
from . import transitions
from .cache import Effect
from .idempotency import KEY_TTL_S, Claim
from .placement import Placement
from .records import ACTIVE, GpuQuarantine, JobPart, JobRecord, NodeCondition
from .records_store import RecordStore, _map
from .transitions import Announcement

# Job records written per round trip by a rebuild.
WRITE_CHUNK = 2000


class SchedulerStore(RecordStore):
    """The scheduler's repository: `RecordStore`'s keys, cache and reads, and every write."""

    def _stage(self, pipe: Pipeline, events: Iterable[Announcement], job_id: str, now: datetime) -> None:
        for a in events:
            env = make_envelope(a.data, source=self.source, subject=job_id, event_id=a.event_id, correlation_id=job_id,
                                time=now)
            self.outbox.stage(pipe, a.subject, env)

    def _set_job(self, pipe: Pipeline, job: JobRecord, effects: list[Effect]) -> None:
        raw = job.model_dump_json()
        pipe.set(self.job_key(job.job_id), raw)
        effects.append(fx.job_written(job.job_id, raw))

    def _release(self, pipe: Pipeline, gpus: list[str], effects: list[Effect]) -> None:
        for gpu in gpus:
            pipe.hdel(self.alloc_key, gpu)
        effects.append(fx.alloc_set(gpus, None))

    async def save(self, job: JobRecord) -> None:
        await self.record_progress([job], [])

    async def record_progress(self, saved: list[JobRecord], ended: list[JobRecord], unqueue: bool = False) -> None:
        """Reports of a batch in one MULTI: records saved (started), and jobs ended with their GPUs released
        (`unqueue`: and taken out of the queue)."""
        if not saved and not ended:
            return
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            for job in saved:
                self._set_job(pipe, job, effects)
            for job in ended:
                self._release(pipe, list(job.gpu_uuids), effects)
                self._set_job(pipe, job, effects)
                if unqueue:
                    pipe.zrem(self.pending_key, job.job_id)
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
                pipe.zadd(self.jobs_key, {job.job_id: job.submitted_at.timestamp()}, nx=True)
                pipe.zadd(self.pending_key, {job.job_id: job.submitted_at.timestamp()}, nx=True)
                effects.append(fx.job_unknown(job.job_id))
            results = await pipe.execute()
        # A duplicate whose first submission has moved on must not stay queued (also repairs a crash of
        # an older scheduler between recording and queueing).
        dups = [job.job_id for job, created in zip(jobs, results[::3], strict=True) if not created]
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
        await self.record_progress([], [job], unqueue)

    async def commit_placements(self, placements: list[tuple[JobRecord, Placement, float | None]],
                                now: datetime, start_within_s: float | None = None) -> None:
        """Every placement of a pass in one MULTI: each job placed, its GPUs held and its job.placed staged
        (with a start_by `start_within_s` after `now`: see `transitions.place`)."""
        if not placements:
            return
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            for job, p, expected_end in placements:
                events = transitions.place(job, p, now, expected_end, start_within_s)
                self._set_job(pipe, job, effects)
                pipe.zrem(self.pending_key, job.job_id)
                pipe.hset(self.alloc_key, mapping={gpu: job.job_id for gpu in job.gpu_uuids})
                effects.append(fx.alloc_set(list(job.gpu_uuids), job.job_id))
                self._stage(pipe, events, job.job_id, now)
            await pipe.execute()

    async def end(self, job: JobRecord, stop: list[JobPart], reason: str, grace_s: float, now: datetime) -> None:
        """The job reached a terminal state: record saved, GPUs released, and the parts still
        running of a failed gang told to stop (they must not run on as half a job)."""
        orders = transitions.stop_orders(job, [(p.rank, p.cluster, p.node) for p in stop], reason, grace_s, "stopped")
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._release(pipe, list(job.gpu_uuids), effects)
            self._set_job(pipe, job, effects)
            self._stage(pipe, orders, job.job_id, now)
            await pipe.execute()

    async def reject(self, job: JobRecord, reason: str, now: datetime) -> None:
        """A job that can never run is rejected with its reason, never queued forever."""
        rejected = transitions.reject(job, reason)
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._set_job(pipe, job, effects)
            pipe.zrem(self.pending_key, job.job_id)
            self._stage(pipe, [rejected], job.job_id, now)
            await pipe.execute()

    async def cancel(self, job: JobRecord, reason: str, by: str | None, grace_s: float, now: datetime) -> bool:
        """Cancel the job: out of the queue, its GPUs released, stop orders to its nodes and job.cancelled staged;
        False (nothing written) if it has ended already."""
        events = transitions.cancel(job, reason, by, grace_s, now)
        if not events:
            return False
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._release(pipe, list(job.gpu_uuids), effects)
            self._set_job(pipe, job, effects)
            pipe.zrem(self.pending_key, job.job_id)
            self._stage(pipe, events, job.job_id, now)
            await pipe.execute()
        return True

    async def requeue(self, job: JobRecord, cause: str, reason: str, now: datetime, stop_grace_s: float | None,
                      spare: frozenset[int] = frozenset(), hold_until: datetime | None = None,
                      moved: bool = False) -> None:
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
        back = transitions.requeue(job, cause, reason, hold_until, moved, now)
        orders: list[Announcement] = []
        if stop_grace_s is not None:
            # Stop orders name the stopped attempt (the record's attempt is not bumped until placed again).
            orders = transitions.stop_orders(job, [p for p in back.parts if p[0] not in spare], reason, stop_grace_s)
        effects: list[Effect] = []
        async with self._transaction(effects) as pipe:
            self._release(pipe, back.released, effects)
            self._set_job(pipe, job, effects)
            pipe.zadd(self.pending_key, {job.job_id: job.submitted_at.timestamp()})
            self._stage(pipe, [*orders, back.event], job.job_id, now)
            await pipe.execute()

    async def set_condition(self, node_key: str, condition: NodeCondition | None,
                            announce: NodeUndrained | None = None, now: datetime | None = None) -> None:
        """A node's condition (None: none); with `announce`, node.undrained staged in the same MULTI."""
        async with self._transaction([fx.condition_set(node_key, condition)]) as pipe:
            if condition is None:
                pipe.hdel(self.conditions_key, node_key)
            else:
                pipe.hset(self.conditions_key, node_key, condition.model_dump_json())
            if announce is not None and now is not None:
                event_id = f"undrained-{announce.cluster}-{announce.node}-{int(now.timestamp() * 1000)}"
                env = make_envelope(announce, source=self.source, subject=announce.node, event_id=event_id, time=now)
                self.outbox.stage(pipe, subjects.node_undrained(announce.cluster, announce.node), env)
            await pipe.execute()

    async def register(self, reg: NodeRegistered) -> None:
        """A node's registration (overwrites the previous one)."""
        key = f"{reg.cluster}/{reg.node}"
        async with self._transaction([fx.registered(key, reg)]) as pipe:
            pipe.hset(self.nodes_key, key, reg.model_dump_json())
            await pipe.execute()

    async def replace_all(self, jobs: list[JobRecord], registrations: dict[str, NodeRegistered],
                          conditions: dict[str, NodeCondition]) -> None:
        """A rebuilt state in place of whatever the store held: every record, the queue (pending jobs),
        the GPU allocations (placed and running jobs), the nodes and their conditions. Unfenced: the
        rebuild runs before this replica decides anything, under the runtime's rebuild claim."""
        pending = {j.job_id: j.submitted_at.timestamp() for j in jobs if j.state == "pending"}
        alloc = {gpu: j.job_id for j in jobs if j.state in ACTIVE for gpu in j.gpu_uuids}
        await self.redis.delete(self.jobs_key, self.pending_key, self.alloc_key, self.nodes_key, self.conditions_key)
        for i in range(0, len(jobs), WRITE_CHUNK):
            chunk = jobs[i:i + WRITE_CHUNK]
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.mset({self.job_key(j.job_id): j.model_dump_json() for j in chunk})
                pipe.zadd(self.jobs_key, {j.job_id: j.submitted_at.timestamp() for j in chunk})
                await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            if pending:
                pipe.zadd(self.pending_key, pending)
            if alloc:
                pipe.hset(self.alloc_key, mapping={k: v for k, v in alloc.items()})
            if registrations:
                pipe.hset(self.nodes_key, mapping={k: r.model_dump_json() for k, r in registrations.items()})
            if conditions:
                pipe.hset(self.conditions_key, mapping={k: c.model_dump_json() for k, c in conditions.items()})
            await pipe.execute()
        self.drop_cache()

    # ------------------------------------------------------------ GPU quarantine (see quarantine.py)

    @property
    def quarantine_key(self) -> str:
        """GPU uuid -> its quarantine (a fault the scheduler saw, or an operator's cordon)."""
        return f"{self.prefix}:gpu-quarantine"

    @property
    def accepted_key(self) -> str:
        """GPU uuid -> the uncorrectable ECC errors an operator accepted when uncordoning it."""
        return f"{self.prefix}:gpu-ecc-accepted"

    async def quarantines(self) -> dict[str, GpuQuarantine]:
        raw = _map(await self.redis.hgetall(self.quarantine_key))
        return {k: GpuQuarantine.model_validate_json(v) for k, v in raw.items()}

    async def accepted_ecc(self) -> dict[str, int]:
        return {k: int(v) for k, v in _map(await self.redis.hgetall(self.accepted_key)).items()}

    async def set_quarantine(self, uuid: str, node: str, record: GpuQuarantine | None,
                             announce: Announcement | None, now: datetime, accepted_ecc: int | None = None) -> None:
        """A GPU's quarantine (None: lifted) with the event that says so, in one fenced MULTI; `accepted_ecc`:
        the ECC errors an operator accepted (only more quarantine it again)."""
        async with self._transaction([]) as pipe:
            if record is None:
                pipe.hdel(self.quarantine_key, uuid)
            else:
                pipe.hset(self.quarantine_key, uuid, record.model_dump_json())
            if accepted_ecc is not None:
                pipe.hset(self.accepted_key, uuid, accepted_ecc)
            if announce is not None:
                env = make_envelope(announce.data, source=self.source, subject=node, event_id=announce.event_id,
                                    time=now)
                self.outbox.stage(pipe, announce.subject, env)
            await pipe.execute()

    async def replace_quarantines(self, records: dict[str, GpuQuarantine], accepted: dict[str, int]) -> None:
        """A rebuilt quarantine in place of whatever the store held (unfenced, like `replace_all`)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.quarantine_key, self.accepted_key)
            if records:
                pipe.hset(self.quarantine_key, mapping={k: r.model_dump_json() for k, r in records.items()})
            if accepted:
                pipe.hset(self.accepted_key, mapping={k: v for k, v in accepted.items()})
            await pipe.execute()

    # ------------------------------------------------------------ idempotency keys

    def idempotency_key(self, digest: str) -> str:
        """What one `Idempotency-Key` (by its digest) stands for, for `KEY_TTL_S`."""
        return f"{self.prefix}:idempotency:{digest}"

    async def claim(self, digest: str, claim: Claim) -> Claim | None:
        """Make the key stand for `claim` unless it stands for something already: None if this call claimed it,
        else the claim it holds. Unfenced: a key is a client's promise, not scheduling state."""
        key = self.idempotency_key(digest)
        if await self.redis.set(key, claim.model_dump_json(), nx=True, ex=KEY_TTL_S):
            return None
        raw = await self.redis.get(key)
        # Expired between the two calls: this one may claim it again.
        return Claim.model_validate_json(raw) if raw is not None else await self.claim(digest, claim)

    async def claimed(self, digest: str) -> Claim | None:
        """What the key stands for, if it is remembered."""
        raw = await self.redis.get(self.idempotency_key(digest))
        return Claim.model_validate_json(raw) if raw is not None else None

    async def mark_durable(self, digest: str, claim: Claim) -> None:
        """Every job.submitted of the claim acknowledged: a replay need not publish again (the TTL is kept)."""
        durable = claim.model_copy(update={"durable": True})
        await self.redis.set(self.idempotency_key(digest), durable.model_dump_json(), xx=True, keepttl=True)
