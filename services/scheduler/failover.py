"""Failover: nodes that go silent, nodes asked to drain, and nodes that come back.

Part of the scheduler shell (a mixin of `SchedulerService`); the decision of
who is suspect or lost is `liveness.assess`, pure.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from whaleflux.shared import subjects
from whaleflux.shared.events import Envelope, JobPreempted, NodeDrainRequested, NodeHeartbeat, NodeRegistered, make_envelope

from . import attempts
from .liveness import Liveness, LivenessPolicy, assess, watch_start
from .records import NodeCondition


# How often one node's heartbeat is compared with what the scheduler thinks runs there.
RECONCILE_EVERY_S = 2.0


class FailoverMixin:
    """Needs from the service: store, settings, clock, log, bus, _lock, _dirty, publish_staged."""

    def _liveness_policy(self) -> LivenessPolicy:
        s = self.settings
        return LivenessPolicy(s.heartbeat_suspect_s, s.heartbeat_lost_s, s.mass_silence_fraction)

    async def on_node_event(self, env: Envelope, data) -> None:
        if isinstance(data, NodeRegistered):
            await self.store.register(data)
        elif isinstance(data, NodeDrainRequested):
            await self.drain(f"{data.cluster}/{data.node}", data.reason)
        self._dirty.set()

    async def on_heartbeat(self, env: Envelope, hb: NodeHeartbeat) -> None:
        """Record liveness by our own clock, as received; a lost node that speaks again is back; what the node
        says it runs is reconciled with what we think it runs (which stops what a node back from the dead still
        runs that moved elsewhere or ended)."""
        key = f"{hb.cluster}/{hb.node}"
        # First, in memory: a node is judged by what we heard, never by whether we could write it down.
        self._heard[key] = self.clock().timestamp()
        if not await self.store.registered(key):
            return  # not registered (yet): nothing to place there
        # Not fenced: a heartbeat time is a fact about the node, harmless from any replica (and read by standbys).
        await self.redis.hset(self.store.seen_key, key, self._heard[key])
        condition = (await self.store.conditions()).get(key)
        if condition is not None and condition.state == "lost":
            await self.store.set_condition(key, None)
            self.log.warning("node.back", node=key, lost_since=condition.since.isoformat())
            self._dirty.set()
        if hb.attempts is not None and self.leadership.is_leader:
            await self.reconcile(env, hb)

    async def reconcile(self, env: Envelope, hb: NodeHeartbeat) -> None:
        """The node is the authority on what runs on it; both ways (see `attempts.reconcile`)."""
        key = f"{hb.cluster}/{hb.node}"
        now = self.clock()
        last = self._reconciled.get(key)
        if last is not None and (now - last).total_seconds() < RECONCILE_EVERY_S:
            return
        self._reconciled[key] = now
        listed = {a.job_id for a in hb.attempts}
        async with self._lock:
            ours = await self.store.jobs_on(key)
            others = await self.store.jobs(sorted(listed - {j.job_id for j in ours}))
            plan = attempts.reconcile(hb, env.time, ours, others, now, self.settings.placement_report_s)
            for report in plan.ended:
                self.log.warning("attempt.ended_per_node", job_id=report.job_id, attempt=report.attempt, node=key,
                                 exit_code=report.exit_code, interrupted=report.interrupted)
                await self._on_progress(report)
            for job, why in plan.lost:
                self.log.error("attempt.lost", job_id=job.job_id, attempt=job.attempt, node=key, reason=why)
                # The other parts of a gang still run: they are stopped, and the job held until they have.
                gang = bool(job.parts)
                await self.store.requeue(job, "attempt_lost", why, now, self.settings.preemption_grace_s if gang else None,
                                         hold_until=self.stop_hold(now) if gang else None)
                self._dirty.set()
        for a in plan.stop:
            await self._stop_stray(hb, a.job_id, a.attempt, "this attempt is not the job's current one here")
        if plan.ended or plan.lost:
            await self.publish_staged()

    async def _stop_stray(self, hb: NodeHeartbeat, job_id: str, attempt: int, reason: str) -> None:
        """Send a stop order for an attempt the node runs that it should not (at most once per heartbeat_lost_s)."""
        now = self.clock()
        last = self._fenced.get((job_id, hb.node))
        if last is not None and (now - last).total_seconds() < self.settings.heartbeat_lost_s:
            return
        self._fenced[(job_id, hb.node)] = now
        order = JobPreempted(job_id=job_id, attempt=attempt, cluster=hb.cluster, node=hb.node, reason=reason,
                             grace_s=self.settings.preemption_grace_s)
        # One id per throttle window: JetStream drops a repeat within its duplicate window, and an order that is
        # sent again (the attempt still runs, say after an agent restart) must arrive.
        window = int(now.timestamp() // self.settings.heartbeat_lost_s)
        env = make_envelope(order, source=self.store.source, subject=job_id,
                            event_id=f"fence-{job_id}-{attempt}-{hb.node}-{window}", correlation_id=job_id, time=now)
        await self.bus.publish_envelope(subjects.job_preempted(hb.cluster, hb.node), env)
        self.log.warning("job.fenced", job_id=job_id, attempt=attempt, node=hb.node, reason=reason)

    def stop_hold(self, now: datetime) -> datetime:
        """Until when a job sent a stop order waits for its old attempt's end before it is placed again:
        the grace period, then as long as a silent node takes to be declared lost (failover and fencing
        take over from there)."""
        return now + timedelta(seconds=self.settings.preemption_grace_s + self.settings.heartbeat_lost_s)

    async def drain(self, node_key: str, reason: str) -> int:
        """No new work on the node; its jobs are stopped there and requeued. Returns how many moved."""
        async with self._lock:
            now = self.clock()
            current = (await self.store.conditions()).get(node_key)
            if current is None or current.state != "draining":
                await self.store.set_condition(node_key, NodeCondition(state="draining", reason=reason, since=now))
            moved = 0
            for job in await self.store.jobs_on(node_key):
                await self.store.requeue(job, "node_drained", f"node drained: {reason}", now, self.settings.preemption_grace_s,
                                         hold_until=self.stop_hold(now))
                moved += 1
        self.log.warning("node.drained", node=node_key, reason=reason, jobs_moved=moved)
        await self.publish_staged()
        self._dirty.set()
        return moved

    async def undrain(self, node_key: str) -> bool:
        current = (await self.store.conditions()).get(node_key)
        if current is None or current.state != "draining":
            return False
        await self.store.set_condition(node_key, None)
        self._dirty.set()
        return True

    async def liveness(self) -> Liveness:
        # Only nodes that ever sent a heartbeat are judged by them. Lost and draining
        # nodes are out already (a drained node holds no jobs to move).
        conditions = await self.store.conditions()
        registered = await self.redis.hkeys(self.store.nodes_key)
        # As heard by this process; a node not heard since we started is judged by what is recorded
        # (and never blamed for the time we were not watching: see `_watching_since`).
        heard = {**(await self.store.last_seen()), **self._heard}
        seen = {k: heard[k] for k in registered if k in heard and k not in conditions}
        return assess(seen, self.clock().timestamp(), self._watching_since, self._liveness_policy())

    async def check_liveness(self) -> Liveness:
        """Declare silent nodes lost and requeue their jobs, unless most of the fleet went silent."""
        async with self._lock:
            live = await self.liveness()
            since = watch_start(self._mass_silence_logged, live, self._watching_since, self.clock().timestamp())
            if since != self._watching_since:
                self.log.warning("nodes.mass_silence_over", still_silent=sorted(live.silent_ages),
                                 note=f"they get {self.settings.heartbeat_lost_s:g} s afresh")
                self._watching_since = since
                live = await self.liveness()
            if live.mass_silence:
                if not self._mass_silence_logged:
                    self.log.error("nodes.mass_silence", silent=sorted(live.held_back), note="rescheduling nothing")
                    self._mass_silence_logged = True
                return live
            self._mass_silence_logged = False
            now = self.clock()
            for key in sorted(live.lost):
                age = live.silent_ages[key]
                reason = f"node lost: no heartbeat for {age:.0f} s"
                await self.store.set_condition(key, NodeCondition(state="lost", reason=reason, since=now))
                jobs = await self.store.jobs_on(key)
                for job in jobs:
                    # The stop order waits in the node's consumer in case it comes back. Its attempt may
                    # still run there (only the agent died): its supervisor stops it once the agent has been
                    # silent as long, so the job is held until then, never run twice.
                    await self.store.requeue(job, "node_lost", reason, now, self.settings.preemption_grace_s,
                                             hold_until=self.stop_hold(now))
                self.log.error("node.lost", node=key, silent_s=round(age, 1), jobs_requeued=len(jobs))
        if live.lost:
            await self.publish_staged()
            self._dirty.set()
        return live

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.heartbeat_suspect_s / 2))
            if not self.state_ready.is_set():
                # Heartbeats wait in the bus while the store is down: silence meanwhile is ours, not the nodes'.
                self._watching_since = self.clock().timestamp()
                continue
            try:
                self._suspects = (await self.check_liveness()).suspect
            except Exception as exc:
                self.log.error("liveness.check_failed", error=repr(exc))

    _watching_since: float = 0.0
    _mass_silence_logged: bool = False
    _suspects: frozenset[str] = frozenset()
    _fenced: dict[tuple[str, str], datetime]
    _heard: dict[str, float]
    _reconciled: dict[str, datetime]
