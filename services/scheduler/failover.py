"""Failover: nodes that go silent, nodes asked to drain, and nodes that come back.

Part of the scheduler shell (a mixin of `SchedulerService`); the decision of
who is suspect or lost is `liveness.assess`, pure.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from whaleflux.shared import subjects
from whaleflux.shared.events import Envelope, JobPreempted, NodeDrainRequested, NodeHeartbeat, NodeRegistered, make_envelope

from .liveness import Liveness, LivenessPolicy, assess
from .records import NodeCondition


class FailoverMixin:
    """Needs from the service: store, settings, clock, log, bus, _lock, _dirty, publish_staged."""

    def _liveness_policy(self) -> LivenessPolicy:
        s = self.settings
        return LivenessPolicy(s.heartbeat_suspect_s, s.heartbeat_lost_s, s.mass_silence_fraction)

    async def on_node_event(self, env: Envelope, data) -> None:
        if isinstance(data, NodeRegistered):
            key = f"{data.cluster}/{data.node}"
            async with self.store.transaction() as pipe:
                pipe.hset(self.store.nodes_key, key, data.model_dump_json())
                await pipe.execute()
        elif isinstance(data, NodeDrainRequested):
            await self.drain(f"{data.cluster}/{data.node}", data.reason)
        self._dirty.set()

    async def on_heartbeat(self, env: Envelope, hb: NodeHeartbeat) -> None:
        """Record liveness by our own clock; a lost node that speaks again is back, and fenced."""
        key = f"{hb.cluster}/{hb.node}"
        if not await self.redis.hexists(self.store.nodes_key, key):
            return  # not registered (yet): nothing to place there
        # Not fenced: a heartbeat time is a fact about the node, harmless from any replica.
        await self.redis.hset(self.store.seen_key, key, self.clock().timestamp())
        condition = (await self.store.conditions()).get(key)
        if condition is not None and condition.state == "lost":
            await self.store.set_condition(key, None)
            self.log.warning("node.back", node=key, lost_since=condition.since.isoformat())
            self._dirty.set()
            # Only a node that was declared lost can run jobs the scheduler gave up on without
            # telling it; a preempted or drained job was already sent its stop order and may
            # still be in its grace period.
            await self._fence(hb)

    async def _fence(self, hb: NodeHeartbeat) -> None:
        """Stop jobs a node back from the dead still runs that were moved elsewhere or ended (one run at a time)."""
        if not hb.running_jobs or not self.leadership.is_leader:
            return
        jobs = await self.store.jobs(list(hb.running_jobs))
        now = self.clock()
        for job_id in hb.running_jobs:
            job = jobs.get(job_id)
            # A node of a gang runs one part of it: fenced only if the current attempt holds nothing there.
            if job is None or (job.state in ("placed", "running") and job.holds(hb.cluster, hb.node)):
                continue
            last = self._fenced.get((job_id, hb.node))
            if last is not None and (now - last).total_seconds() < self.settings.heartbeat_lost_s:
                continue
            self._fenced[(job_id, hb.node)] = now
            order = JobPreempted(
                job_id=job_id,
                attempt=max(job.attempt, 1),
                cluster=hb.cluster,
                node=hb.node,
                reason=f"job {job.state} elsewhere or ended; this node was declared lost",
                grace_s=self.settings.preemption_grace_s,
            )
            env = make_envelope(
                order, source=self.store.source, subject=job_id, event_id=f"fence-{job_id}-{job.attempt}-{hb.node}",
                correlation_id=job_id, time=now,
            )
            await self.bus.publish_envelope(subjects.job_preempted(hb.cluster, hb.node), env)
            self.log.warning("job.fenced", job_id=job_id, node=hb.node, state=job.state)

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
        seen = {k: t for k, t in (await self.store.last_seen()).items() if k not in conditions}
        return assess(seen, self.clock().timestamp(), self._watching_since, self._liveness_policy())

    async def check_liveness(self) -> Liveness:
        """Declare silent nodes lost and requeue their jobs, unless most of the fleet went silent."""
        async with self._lock:
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
                    # The stop order waits in the node's consumer in case it comes back.
                    await self.store.requeue(job, "node_lost", reason, now, self.settings.preemption_grace_s)
                self.log.error("node.lost", node=key, silent_s=round(age, 1), jobs_requeued=len(jobs))
        if live.lost:
            await self.publish_staged()
            self._dirty.set()
        return live

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.heartbeat_suspect_s / 2))
            try:
                self._suspects = (await self.check_liveness()).suspect
            except Exception as exc:
                self.log.error("liveness.check_failed", error=repr(exc))

    _watching_since: float = 0.0
    _mass_silence_logged: bool = False
    _suspects: frozenset[str] = frozenset()
    _fenced: dict[tuple[str, str], datetime]
