"""Scheduler service: keeps job records, queues and allocations; places, preempts and moves jobs.

Consumes job.submitted / started / finished / failed, node.registered,
node.drain_requested and node.heartbeat; produces job.placed, job.preempted,
job.requeued and job.rejected through the outbox, so a crash never loses or
doubles one. A pass of the queue policy (`queueing.schedule`) runs whenever
something changed and every `pass_interval_s`; a liveness check every second
moves the jobs of nodes that went silent (`failover.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.bus import batch_handler
from whaleflux.shared.events import Envelope, JobFailed, JobFinished, JobStarted, JobSubmitted
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from .failover import FailoverMixin
from .feeds import FeedsMixin
from .gang import on_part_report
from .history import after_end, late_end, record_end
from .leadership import Leadership
from .placement import ClusterState, ModelFacts, explain_wait
from .queueing import POLICIES, PendingQueue, PolicyConfig, ScheduleRequest, TeamPolicy, schedule
from .records import ACTIVE, JobRecord
from .routes import SubmitRequest, add_routes  # noqa: F401 (SubmitRequest: part of this module's API)
from .schedule_request import NodeView, held, node_state, pending_job, running_job
from .rebuild import rebuild, snapshot
from .store import SchedulerStore


# Events published at once by an outbox flush (in staging order).
OUTBOX_WINDOW = 256
# How many jobs a pass did not reach still get a full "why" each pass (it costs a scan of the nodes each).
EXPLAIN_UNEXAMINED = 50


class TeamSettings(BaseModel):
    quota_gpus: int | None = Field(None, ge=0)
    weight: float = Field(1.0, gt=0)


class SchedulerSettings(CommonSettings):
    http_port: int = 8702
    pass_interval_s: float = Field(1.0, gt=0)
    policy: Literal["whaleflux", "backfill", "fifo"] = "whaleflux"
    # Quotas and fair-share weights: WHALEFLUX_TEAMS='{"nlp": {"quota_gpus": 8, "weight": 2}}',
    # or a YAML file `teams: {nlp: {quota_gpus: 8}}` (the file wins for teams in both).
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    teams_file: Path | None = None
    min_run_before_preemption_s: float = Field(600.0, ge=0)
    max_preemptions_per_job: int = Field(3, ge=0)
    preemption_grace_s: float = Field(5.0, ge=0, le=3600)
    heartbeat_suspect_s: float = Field(5.0, gt=0)
    heartbeat_lost_s: float = Field(10.0, gt=0)
    mass_silence_fraction: float = Field(0.5, gt=0, le=1)
    max_restarts: int = Field(3, ge=0)
    # A placed attempt its node still does not list after this long never reached it: requeued.
    placement_report_s: float = Field(30.0, gt=0)
    # The job history is folded into a snapshot this often, keeping jobs that ended within
    # `keep_finished_days`: a rebuild after a lost store reads the snapshot and the stream's tail only.
    snapshot_interval_s: float = Field(300.0, gt=0)
    keep_finished_days: float = Field(7.0, gt=0)
    # Lease ends of leased and rented nodes, from inventory (empty: not asked).
    inventory_url: str = "http://127.0.0.1:8705"
    lease_refresh_s: float = Field(60.0, gt=0)
    # The policy's moves of running checkpointable jobs (to faster GPUs, out of a blocked job's way).
    migration: bool = True
    # Active/standby replicas: the leader's lease lives this long unless renewed
    # (every third of it); a standby takes over within about this long after the leader dies.
    leader_lease_s: float = Field(3.0, ge=0.3, le=60)

    @model_validator(mode="after")
    def _lost_after_suspect(self) -> "SchedulerSettings":
        if self.heartbeat_lost_s < self.heartbeat_suspect_s:
            raise ValueError("WHALEFLUX_HEARTBEAT_LOST_S must be >= WHALEFLUX_HEARTBEAT_SUSPECT_S")
        return self

    def team_policies(self) -> dict[str, TeamPolicy]:
        teams = dict(self.teams)
        if self.teams_file is not None:
            doc = yaml.safe_load(self.teams_file.read_text()) or {}
            teams.update({k: TeamSettings.model_validate(v or {}) for k, v in (doc.get("teams") or {}).items()})
        return {name: TeamPolicy(t.quota_gpus, t.weight) for name, t in teams.items()}

    def policy_config(self) -> PolicyConfig:
        policy = POLICIES[self.policy]
        return dataclasses.replace(
            policy,
            # A job that fits on one node runs on one node: its command need not be written for
            # several (the simulator may split such a job when that is faster; the service never does).
            profile=dataclasses.replace(policy.profile, split_min_speed_ratio=None),
            min_run_before_preemption_s=self.min_run_before_preemption_s,
            max_preemptions_per_job=self.max_preemptions_per_job,
            # Moves as the policy has them (the simulator's defaults), unless turned off.
            **({} if self.migration else {"migrate_min_gain_s": None, "make_room_by_migration": False}),
        )


class SchedulerService(FailoverMixin, FeedsMixin, ServiceBase):
    name = "scheduler"

    def __init__(self, settings: SchedulerSettings, **kw):
        super().__init__(settings, **kw)
        self.settings: SchedulerSettings = settings
        self.policy = settings.policy_config()
        self.teams = settings.team_policies()
        self.facts = {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}
        self.store: SchedulerStore | None = None
        self.leadership: Leadership | None = None
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._fenced = {}
        self._heard = {}
        self._memory = {}
        self._leases = {}
        self._waiting: dict[str, str] = {}  # the reasons last stored, so a pass writes only what changed
        self._reconciled = {}

    async def get_job(self, job_id: str) -> JobRecord | None:
        return await self.store.job(job_id)

    # ---------------------------------------------------------------- handlers

    def consumers(self):
        return {
            "scheduler-jobs": self.on_job_events,
            "scheduler-nodes": self.on_node_event,
            "scheduler-heartbeats": self.on_heartbeat,
            "scheduler-telemetry": self.on_telemetry,
        }

    @batch_handler
    async def on_job_events(self, events: list[tuple[Envelope, object]]) -> None:
        """A fetch of job events, in stream order: each run of submissions recorded in one MULTI,
        progress reports one by one. Every handler is idempotent by nature (SET NX, attempt and state
        guards), so a batch handled again after a failure changes nothing twice."""
        submitted: list[JobRecord] = []
        progressed = False
        for env, data in events:
            if isinstance(data, JobSubmitted):
                submitted.append(JobRecord(job_id=data.job_id, spec=data, submitted_at=env.time))
                continue
            if isinstance(data, (JobStarted, JobFinished, JobFailed)):
                await self.store.submit(submitted)
                submitted = []
                async with self._lock:
                    await self._on_progress(data)
                progressed = True
        await self.store.submit(submitted)
        self._dirty.set()
        if progressed:
            await self.publish_staged()

    async def on_job_event(self, env: Envelope, data) -> None:
        """One job event (as `on_job_events`)."""
        await self.on_job_events([(env, data)])

    async def _on_progress(self, data: JobStarted | JobFinished | JobFailed) -> None:
        job = await self.store.job(data.job_id)
        if job is not None and late_end(job, data):
            await self._on_late_end(job, data)
            return
        if (job is not None and job.state == "pending" and job.held_until is not None and data.attempt == job.attempt
                and isinstance(data, (JobFinished, JobFailed))):
            # The stopped attempt of a preempted, moved or drained job ended (its checkpoint is written): place it again.
            job.held_until = None
            await self.store.save(job)
            self.log.info("job.stopped", job_id=job.job_id, attempt=data.attempt)
            self._dirty.set()
            return
        # Only the current attempt while it holds GPUs: reports of a preempted or
        # lost attempt (the job is pending again, or placed anew) change nothing.
        if job is None or data.attempt != job.attempt or job.state not in ACTIVE:
            self.log.info("job.progress_ignored", job_id=data.job_id, attempt=data.attempt)
            return
        if job.parts:
            await self._on_gang_progress(job, data)
            return
        if isinstance(data, JobStarted):
            if job.state == "placed":
                job.state, job.started_at = "running", data.started_at
                await self.store.save(job)
            return
        await self.end_attempt(job, data)

    async def _on_late_end(self, job: JobRecord, data: JobFinished | JobFailed) -> None:
        """The attempt we gave up on (its node went silent) ended on its own after all, before another was placed:
        its end is the job's end (or, per the job's policy, it runs again at once), never a second full run."""
        decision = after_end(job, data, self.settings.max_restarts)
        job.held_until = job.lost_attempt = None
        if decision.requeue:
            await self.store.save(job)
        else:
            record_end(job, data)
            await self.store.finish(job, unqueue=True)
        self.log.warning("job.lost_attempt_ended", job_id=job.job_id, attempt=data.attempt, state=job.state,
                         exit_code=getattr(data, "exit_code", None))
        self._dirty.set()

    async def end_attempt(self, job: JobRecord, data: JobFinished | JobFailed) -> None:
        """The current attempt of a job on one node ended (reported, or read off the node's heartbeat)."""
        decision = after_end(job, data, self.settings.max_restarts)
        if decision.requeue:
            await self.store.requeue(job, decision.cause, decision.reason, self.clock(), None)
            self.log.info("job.requeued", job_id=job.job_id, attempt=data.attempt, cause=decision.cause)
            self._dirty.set()
            return
        record_end(job, data)
        await self.store.finish(job)
        self._dirty.set()

    async def _on_gang_progress(self, job: JobRecord, data: JobStarted | JobFinished | JobFailed) -> None:
        """A part of a gang spanning nodes reported: all or nothing (see gang.py)."""
        if isinstance(data, JobFinished) and data.interrupted:
            # A planned stop of one part: the whole gang goes back to the queue to resume, the other parts stop.
            rank = data.rank or 0
            await self.store.requeue(job, "interrupted", data.interrupted, self.clock(), self.settings.preemption_grace_s,
                                     frozenset({rank}), hold_until=self.stop_hold(self.clock()))
            self._dirty.set()
            return
        step = on_part_report(job, data)
        if step.action == "ignore":
            self.log.info("job.progress_ignored", job_id=job.job_id, attempt=data.attempt, rank=data.rank, node=data.node)
            return
        if step.action == "save":
            await self.store.save(job)
            return
        now, grace = self.clock(), self.settings.preemption_grace_s
        if step.action == "failed" and job.spec.restart_on_failure and len(job.requeues) < self.settings.max_restarts:
            stopping = {p.rank for p in step.stop}
            spare = frozenset(p.rank for p in job.parts if p.rank not in stopping)
            await self.store.requeue(job, "restart_on_failure", f"failed ({step.reason}), restarting", now, grace, spare)
        else:
            if step.action == "failed":
                failed = next(p for p in job.parts if p.rank == (data.rank or 0))
                job.state, job.reason, job.exit_code, job.finished_at = "failed", step.reason, failed.exit_code, failed.finished_at
            await self.store.end(job, list(step.stop), f"gang failed: {step.reason}", grace, now)
        self.log.info("job.gang_" + step.action, job_id=job.job_id, attempt=job.attempt, reason=step.reason,
                      stopping=[p.node for p in step.stop])
        self._dirty.set()

    # ---------------------------------------------------------------- placement

    async def schedule_pass(self) -> int:
        """One pass of the queue policy over the whole queue; returns how many jobs were placed."""
        async with self._lock:
            now = self.clock()
            regs = await self.store.registrations()
            conditions = await self.store.conditions()
            alloc = await self.store.alloc()
            pending_ids = await self.redis.zrange(self.store.pending_key, 0, -1)
            active_ids = sorted(set(alloc.values()))
            # Read only (the cache's own objects while leading): a job the pass changes is re-read as a copy.
            records = await self.store.jobs_shared(pending_ids + active_ids)
            stale = [j for j in pending_ids if j not in records or records[j].state != "pending"]
            await self.store.unqueue(stale)

            free = self.measured_free()
            views = [NodeView(reg, conditions.get(key), key in self._suspects, free, self._leases.get(reg.node))
                     for key, reg in sorted(regs.items())]
            cluster = ClusterState([node_state(v, alloc) for v in views], self.facts)
            queue = PendingQueue(self.policy)
            for seq, job_id in enumerate(pending_ids):
                # A moved job waits out its old attempt's stop (never two copies): not in this pass.
                if job_id not in stale and not held(records[job_id], now):
                    queue.add(pending_job(records[job_id], seq))
            running = {j: running_job(records[j], cluster, now.timestamp())
                       for j in active_ids if j in records and records[j].state in ACTIVE}
            # In a thread: a long pass must not starve the event loop (lease renewal, HTTP) of the GIL for its length.
            reply = await asyncio.to_thread(schedule, ScheduleRequest(now.timestamp(), cluster, queue, running, self.policy, self.teams))

            # Victims first: their stop orders go out before placements reuse their GPUs. A stopped job
            # waits for its old attempt to end before it is placed again (never two copies).
            grace = self.settings.preemption_grace_s
            hold = self.stop_hold(now)
            changed = await self.store.jobs([p.victim for p in reply.preempted] + [m.job_id for m in reply.migrated]
                                            + [s.job.job_id for s in reply.started] + list(reply.infeasible))
            for p in reply.preempted:
                await self.store.requeue(changed[p.victim], "preempted", p.reason, now, grace, hold_until=hold)
                self.log.info("job.preempted", job_id=p.victim, for_job=p.for_job, reason=p.reason)
            # Moves are preemptions too (stop order, requeue, resume from the checkpoint). The policy's new
            # placement is not kept: a later pass places the job once its old attempt has stopped.
            for m in reply.migrated:
                await self.store.requeue(changed[m.job_id], "preempted", m.reason, now, grace, hold_until=hold, moved=True)
                self.log.info("job.migrated", job_id=m.job_id, to=m.placement.node, model=m.placement.model,
                              reason=m.reason)
            await self.store.commit_placements([(changed[s.job.job_id], s.placement, s.expected_end) for s in reply.started], now)
            for s in reply.started:
                job = changed[s.job.job_id]
                self.log.info("job.placed", job_id=job.job_id, node=job.node, gpus=list(s.placement.gpu_indices),
                              attempt=job.attempt, backfilled=s.backfilled, gang=job.nodes if job.parts else None)
            for job_id, reason in reply.infeasible.items():
                await self.store.reject(changed[job_id], reason)
                self.log.info("job.rejected", job_id=job_id, reason=reason)
            waiting = dict(reply.waiting)
            # Jobs the pass did not examine (nothing free): the first few still get a full answer.
            for job_id in [j for j in pending_ids if j in queue and j not in waiting][:EXPLAIN_UNEXAMINED]:
                waiting[job_id] = explain_wait(cluster, queue.get(job_id).request, self.policy.profile, now.timestamp())
            not_reached = "no GPU free" if cluster.total_free == 0 else "not reached in this pass"
            reasons = {j: waiting.get(j, not_reached) for j in pending_ids if j in queue}
        # Outside the lock, and only what changed: a reason is not a decision, and rewriting every
        # pending job each pass made the pass cost the queue's length in round trips.
        changed = {j: why for j, why in reasons.items() if self._waiting.get(j) != why}
        gone = [j for j in self._waiting if j not in reasons]
        await self.store.set_waiting(changed, gone)
        self._waiting = reasons
        if reply.started or reply.preempted or reply.migrated or reply.infeasible:
            await self.publish_staged()
        return len(reply.started)

    async def on_ready(self) -> None:
        lease_s = self.settings.leader_lease_s
        self.leadership = Leadership(self.redis, self.prefix, self.settings.instance, lease_s)
        self.store = SchedulerStore(
            self.redis, self.prefix, self.outbox, f"whaleflux/scheduler/{self.settings.instance}", self.leadership,
            lambda: self.epoch,
        )
        # A standby serves reads over HTTP from here on, but binds no consumer and runs
        # no pass (the shell starts those after this returns) until it holds the lease.
        self.log.info("leader.waiting", holder=self.leadership.holder)
        token = await self.leadership.acquire(poll_s=lease_s / 6)
        self.log.warning("leader.elected", holder=self.leadership.holder, token=token)
        self._tasks.append(asyncio.create_task(self.leadership.keep(self._lease_lost), name="leader-lease"))
        # Nodes are judged by heartbeats seen from now on, not blamed for our own downtime
        # (or for the time we were a standby).
        self._watching_since = self.clock().timestamp()
        # Placements committed before a crash (ours or the previous leader's) but not yet published go out now.
        await self.publish_staged()

    async def rebuild_state(self) -> None:
        """Fold the job history in JetStream into a fresh state (see rebuild.py), deciding nothing meanwhile."""
        async with self._lock:
            done = await rebuild(self.bus, self.redis, self.store, self._hold_s, self.settings.max_restarts, self.clock())
            # Nodes get a fresh chance to be heard: a gap in heartbeats while we rebuilt is ours.
            self._watching_since = self.clock().timestamp()
            self._waiting = {}
            self.store.drop_cache()  # the rebuild wrote the store directly
        self.log.warning("state.folded", jobs=done.jobs, events=done.events, pending=done.pending, active=done.active,
                         nodes=done.nodes, last_seq=done.last_seq)
        self._dirty.set()

    async def _lease_lost(self) -> None:
        """Another replica leads now: our transactions fail from here on (fencing); stop cleanly,
        to be restarted as a standby by whatever supervises the process."""
        self.log.error("leader.lost", holder=self.leadership.holder, note="another replica holds the lease; exiting")
        os.kill(os.getpid(), signal.SIGTERM)

    async def publish_staged(self) -> None:
        # The outbox is shared by the replicas: only the leader sends what it holds.
        if self.leadership is not None and self.leadership.is_leader:
            # A pass stages thousands of placements: publish them a window at a time, in order.
            await self.outbox.flush(self.bus, window=OUTBOX_WINDOW)

    async def readiness(self) -> dict:
        checks = await super().readiness()
        if self.leadership is None or not self.leadership.is_leader:
            # A standby binds no consumers and rebuilds nothing until it wins the lease; it is ready to serve reads.
            checks = {k: v for k, v in checks.items() if not k.startswith("consumer:") and k != "state"}
        return checks

    async def stop(self) -> None:
        if self.leadership is not None and self.redis is not None:
            try:
                await self.leadership.release()
            except Exception as exc:
                self.log.warning("leader.release_failed", error=repr(exc))
        await super().stop()

    @property
    def _hold_s(self) -> float:
        """How long a stopped attempt may take to end (as `stop_hold`)."""
        return self.settings.preemption_grace_s + self.settings.heartbeat_lost_s

    def background(self):
        return [self._placement_loop, self._liveness_loop, self._snapshot_loop, self._lease_loop]

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.snapshot_interval_s)
            try:
                seq, jobs = await snapshot(self.bus, self._hold_s, self.settings.max_restarts, self.clock(),
                                           self.settings.keep_finished_days * 86400)
                self.log.info("history.snapshot", seq=seq, jobs=jobs)
            except Exception as exc:  # the next tick tries again; a rebuild without it reads more of the stream
                self.log.warning("history.snapshot_failed", error=repr(exc))

    async def _placement_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), self.settings.pass_interval_s)
            except asyncio.TimeoutError:
                pass
            self._dirty.clear()
            if not self.state_ready.is_set():
                continue  # nothing is decided on a store that is down or being rebuilt
            try:
                await self.schedule_pass()
            except Exception as exc:
                self.log.error("placement.pass_failed", error=repr(exc))
                await asyncio.sleep(1.0)

    # ---------------------------------------------------------------- HTTP

    def add_routes(self, app, admin) -> None:
        add_routes(self, app, admin)


def main() -> None:
    run_service(SchedulerService(SchedulerSettings()))
