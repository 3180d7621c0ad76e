"""The scheduler's Redis state, and the transactions that change it together with the events they cause.

Every state change that others must hear about stages its event in the
outbox inside the same MULTI, with an id fixed by (job, attempt), so a crash
neither loses nor doubles it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
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


def part_event_id(kind: str, job_id: str, attempt: int, rank: int) -> str:
    """The outbox id of an event about one part of an attempt: rank 0 (and a one-node job) keeps the plain id."""
    return f"{kind}-{job_id}-{attempt}" + (f"-r{rank}" if rank else "")


class SchedulerStore:
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

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Pipeline]:
        """A MULTI that commits only while this replica's fencing token is the current one.

        WATCH on the token counter: if another replica took the lease between the
        check and EXEC, EXEC fails and nothing is written (raised as NotLeader).
        """
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
                raise NotLeader(f"another replica took the lease (token {token} is stale)") from exc

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
        raw = await self.redis.get(self.job_key(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    async def jobs(self, job_ids: list[str]) -> dict[str, JobRecord]:
        if not job_ids:
            return {}
        raws = await self.redis.mget([self.job_key(j) for j in job_ids])
        return {j: JobRecord.model_validate_json(r) for j, r in zip(job_ids, raws) if r}

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
        """`cluster/node` -> its registration."""
        raw = await self.redis.hgetall(self.nodes_key)
        return {k: NodeRegistered.model_validate_json(v) for k, v in raw.items()}

    async def conditions(self) -> dict[str, NodeCondition]:
        raw = await self.redis.hgetall(self.conditions_key)
        return {k: NodeCondition.model_validate_json(v) for k, v in raw.items()}

    async def last_seen(self) -> dict[str, float]:
        return {k: float(v) for k, v in (await self.redis.hgetall(self.seen_key)).items()}

    async def alloc(self) -> dict[str, str]:
        return await self.redis.hgetall(self.alloc_key)

    async def jobs_on(self, node_key: str) -> list[JobRecord]:
        """Jobs holding GPUs of the node (`cluster/node`)."""
        reg = (await self.registrations()).get(node_key)
        if reg is None:
            return []
        alloc = await self.alloc()
        ids = sorted({alloc[g.uuid] for g in reg.gpus if g.uuid in alloc})
        return [j for j in (await self.jobs(ids)).values() if j.state in ("placed", "running")]

    # ------------------------------------------------------------ writes

    async def save(self, job: JobRecord) -> None:
        async with self.transaction() as pipe:
            pipe.set(self.job_key(job.job_id), job.model_dump_json())
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
        async with self.transaction() as pipe:
            for job, p, expected_end in placements:
                events = self._placed(job, p, now, expected_end)
                pipe.set(self.job_key(job.job_id), job.model_dump_json())
                pipe.zrem(self.pending_key, job.job_id)
                for gpu in job.gpu_uuids:
                    pipe.hset(self.alloc_key, gpu, job.job_id)
                for subject, env in events:
                    self.outbox.stage(pipe, subject, env)
            await pipe.execute()

    async def commit_placement(self, job: JobRecord, p: Placement, now: datetime, expected_end: float | None) -> None:
        """One job placed, its GPUs held and job.placed staged (one per node of a gang): all or nothing."""
        await self.commit_placements([(job, p, expected_end)], now)

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
        async with self.transaction() as pipe:
            pipe.set(self.job_key(job.job_id), job.model_dump_json())
            for gpu in job.gpu_uuids:
                pipe.hdel(self.alloc_key, gpu)
            self._stop_orders(pipe, job, [(p.rank, p.cluster, p.node) for p in stop], reason, grace_s, now, "stopped")
            await pipe.execute()

    async def reject(self, job: JobRecord, reason: str) -> None:
        """A job that can never run is rejected with its reason, never queued forever."""
        job.state, job.reason = "rejected", reason
        env = self._envelope(JobRejected(job_id=job.job_id, reason=reason), f"rejected-{job.job_id}", job.job_id)
        async with self.transaction() as pipe:
            pipe.set(self.job_key(job.job_id), job.model_dump_json())
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
        async with self.transaction() as pipe:
            pipe.set(self.job_key(job.job_id), job.model_dump_json())
            for gpu in held:
                pipe.hdel(self.alloc_key, gpu)
            pipe.zadd(self.pending_key, {job.job_id: job.submitted_at.timestamp()})
            if stop_grace_s is not None:
                self._stop_orders(pipe, job, [p for p in parts if p[0] not in spare], reason, stop_grace_s, now)
            self.outbox.stage(pipe, subjects.JOB_REQUEUED, self._envelope(requeued, f"requeued-{job.job_id}-{attempt}", job.job_id, now))
            await pipe.execute()

    async def set_condition(self, node_key: str, condition: NodeCondition | None) -> None:
        async with self.transaction() as pipe:
            if condition is None:
                pipe.hdel(self.conditions_key, node_key)
            else:
                pipe.hset(self.conditions_key, node_key, condition.model_dump_json())
            await pipe.execute()
