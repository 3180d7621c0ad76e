"""Failover: nodes that go silent, nodes asked to drain, and nodes that come back.

The decision of who is suspect or lost is `liveness.assess`, and what a node's
heartbeat says about its attempts is `attempts.reconcile`, both pure; this
applies them to the store, under the scheduler's lock.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from whaleflux.shared import subjects
from whaleflux.shared.events import (
    Envelope,
    EventData,
    JobPreempted,
    NodeDrainRequested,
    NodeHeartbeat,
    NodeRegistered,
    NodeUndrained,
)

from . import attempts
from .fencing import lost_hold, node_hold_s
from .liveness import Liveness, LivenessPolicy, assess, judged_from, watch_start
from .progress import Progress
from .records import NodeCondition
from .service import TROUBLE, Scheduler

# How often one node's heartbeat is compared with what the scheduler thinks runs there.
RECONCILE_EVERY_S = 2.0


async def store_condition(scheduler: Scheduler, key: str, condition: NodeCondition | None) -> None:
    """Set a node's condition under the scheduler's lock, and have the next pass see it."""
    async with scheduler.lock:
        await scheduler.store.set_condition(key, condition)
    scheduler.dirty.set()


class Failover:
    """Node events and heartbeats in; lost nodes' jobs requeued, drained nodes emptied, strays stopped."""

    def __init__(self, scheduler: Scheduler, progress: Progress):
        self.s = scheduler
        self.progress = progress
        settings = scheduler.settings
        self.policy = LivenessPolicy(settings.heartbeat_suspect_s, settings.heartbeat_lost_s,
                                     settings.mass_silence_fraction)
        # Nodes suspect as of the last check (the pass places nothing new there).
        self.suspects: frozenset[str] = frozenset()
        # Nodes are judged by heartbeats heard since then (never blamed for time we were not watching).
        self.watching_since = 0.0
        self._mass_silence_logged = False
        self._heard: dict[str, float] = {}  # node -> when we last heard it (epoch s, our clock)
        self._registered: dict[str, float] = {}  # node -> when we got its registration (epoch s, our clock)
        self._fenced: dict[tuple[str, str], datetime] = {}  # (job, node) -> when a stop order last went there
        self._reconciled: dict[str, datetime] = {}  # node -> when its heartbeat was last reconciled

    def watch_afresh(self) -> None:
        """Nodes get a fresh chance to be heard (after our own downtime, a rebuild, or time as a standby)."""
        self.watching_since = self.s.clock().timestamp()

    async def on_node_event(self, env: Envelope, data: EventData) -> None:
        if isinstance(data, NodeRegistered):
            await self.s.store.register(data)
            settings = self.s.settings
            if node_hold_s(settings.hold_s, settings.heartbeat_lost_s, data) > settings.hold_s:
                self.s.log.error("node.fence_budget_longer", node=f"{data.cluster}/{data.node}",
                                 node_fence_after_s=data.fence_after_s, node_stop_grace_s=data.stop_grace_s,
                                 scheduler_fence_after_s=settings.fence_after_s,
                                 note="its lost jobs are held for its budget; set WHALEFLUX_FENCE_AFTER_S alike")
            self._registered[f"{data.cluster}/{data.node}"] = self.s.clock().timestamp()
        elif isinstance(data, NodeDrainRequested):
            await self.drain(f"{data.cluster}/{data.node}", data.reason)
        self.s.dirty.set()

    def heard_at(self, node_key: str) -> float | None:
        """When this process last heard the node's heartbeat (epoch s, our clock; None: not since it started)."""
        return self._heard.get(node_key)

    async def on_heartbeat(self, env: Envelope, hb: EventData) -> None:
        """Record liveness by our own clock, as received; a lost node that speaks again is back; what the node
        says it runs is reconciled with what we think it runs (which stops what a node back from the dead still
        runs that moved elsewhere or ended)."""
        if not isinstance(hb, NodeHeartbeat):
            return  # the heartbeat consumer's subjects carry nothing else
        key = f"{hb.cluster}/{hb.node}"
        store = self.s.store
        # First, in memory: a node is judged by what we heard, never by whether we could write it down.
        self._heard[key] = self.s.clock().timestamp()
        if not await store.registered(key):
            return  # not registered (yet): nothing to place there
        await store.record_heard(key, self._heard[key])
        condition = (await store.conditions()).get(key)
        if condition is not None and condition.state == "lost":
            await store.set_condition(key, None)
            self.s.log.warning("node.back", node=key, lost_since=condition.since.isoformat())
            self.s.dirty.set()
            condition = None
        await self._node_health(key, condition, hb)
        if hb.attempts is not None and self.s.is_leader:
            await self.reconcile(env, hb)

    async def _node_health(self, key: str, condition: NodeCondition | None, hb: NodeHeartbeat) -> None:
        """What the node says of itself: a fault (a full disk) takes it out of placement as unhealthy, with the
        agent's reason; a heartbeat without one puts it back. A drain (an operator's, an alert's) outranks both."""
        now_unhealthy = condition is not None and condition.state == "unhealthy"
        if hb.fault is not None and (condition is None or (now_unhealthy and condition.reason != hb.fault)):
            await store_condition(self.s, key, NodeCondition(state="unhealthy", reason=hb.fault, since=self.s.clock()))
            self.s.log.error("node.unhealthy", node=key, reason=hb.fault)
        elif hb.fault is None and now_unhealthy:
            await store_condition(self.s, key, None)
            self.s.log.warning("node.healthy_again", node=key, was=condition.reason if condition else None)

    async def reconcile(self, env: Envelope, hb: NodeHeartbeat) -> None:
        """The node is the authority on what runs on it; both ways (see `attempts.reconcile`)."""
        key = f"{hb.cluster}/{hb.node}"
        now = self.s.clock()
        last = self._reconciled.get(key)
        if last is not None and (now - last).total_seconds() < RECONCILE_EVERY_S:
            return
        self._reconciled[key] = now
        listed = {a.job_id for a in hb.attempts or []}
        settings, store = self.s.settings, self.s.store
        async with self.s.lock:
            ours = await store.jobs_on(key)
            others = await store.jobs(sorted(listed - {j.job_id for j in ours}))
            # A part of an ended job, told to stop, is told again after its grace and a lost node's time.
            stopping_s = settings.preemption_grace_s + settings.heartbeat_lost_s
            plan = attempts.reconcile(hb, env.time, ours, others, now, settings.placement_report_s, stopping_s)
            for report in plan.ended:
                self.s.log.warning("attempt.ended_per_node", job_id=report.job_id, attempt=report.attempt, node=key,
                                   exit_code=report.exit_code, interrupted=report.interrupted)
                await self.progress.on_report(report)
            lost = [(job, why, False) for job, why in plan.lost]
            lost += [(job, u.why, not u.confirmed) for job, u in plan.unstarted]
            for job, why, unsure in lost:
                self.s.log.error("attempt.lost", job_id=job.job_id, attempt=job.attempt, node=key, reason=why)
                # The other parts of a gang still run: they are stopped, and the job held until they have. So is
                # an attempt its node may still start (placed with no start-by): the stop order follows it.
                held = bool(job.parts) or unsure
                await store.requeue(job, "attempt_lost", why, now, settings.preemption_grace_s if held else None,
                                    hold_until=settings.stop_hold(now) if held else None)
                self.s.dirty.set()
            for job in plan.released:
                self.s.log.info("job.stopped", job_id=job.job_id, attempt=job.attempt, node=key,
                                reason="its node refused the attempt: it never started")
                job.held_until = None
                await store.save(job)
                self.s.dirty.set()
        for a in plan.stop:
            await self._stop_stray(hb, a.job_id, a.attempt, "this attempt is not the job's current one here")
        if plan.ended or plan.lost or plan.unstarted:
            await self.s.publish_staged()

    async def _stop_stray(self, hb: NodeHeartbeat, job_id: str, attempt: int, reason: str) -> None:
        """Send a stop order for an attempt the node runs that it should not (at most once per heartbeat_lost_s)."""
        settings, now = self.s.settings, self.s.clock()
        last = self._fenced.get((job_id, hb.node))
        if last is not None and (now - last).total_seconds() < settings.heartbeat_lost_s:
            return
        self._fenced[(job_id, hb.node)] = now
        order = JobPreempted(job_id=job_id, attempt=attempt, cluster=hb.cluster, node=hb.node, reason=reason,
                             grace_s=settings.preemption_grace_s)
        # One id per throttle window: JetStream drops a repeat within its duplicate window, and an order that is
        # sent again (the attempt still runs, say after an agent restart) must arrive.
        window = int(now.timestamp() // settings.heartbeat_lost_s)
        runtime = self.s.runtime
        env = runtime.envelope(order, subject=job_id, event_id=f"fence-{job_id}-{attempt}-{hb.node}-{window}",
                               correlation_id=job_id)
        await runtime.bus.publish_envelope(subjects.job_preempted(hb.cluster, hb.node), env)
        self.s.log.warning("job.fenced", job_id=job_id, attempt=attempt, node=hb.node, reason=reason)

    async def drain(self, node_key: str, reason: str) -> int:
        """No new work on the node; its jobs are stopped there and requeued. Returns how many moved."""
        settings, store = self.s.settings, self.s.store
        async with self.s.lock:
            now = self.s.clock()
            current = (await store.conditions()).get(node_key)
            if current is None or current.state != "draining":
                await store.set_condition(node_key, NodeCondition(state="draining", reason=reason, since=now))
            moved = 0
            for job in await store.jobs_on(node_key):
                await store.requeue(job, "node_drained", f"node drained: {reason}", now, settings.preemption_grace_s,
                                    hold_until=settings.stop_hold(now))
                moved += 1
        self.s.log.warning("node.drained", node=node_key, reason=reason, jobs_moved=moved)
        await self.s.publish_staged()
        self.s.dirty.set()
        return moved

    async def undrain(self, node_key: str) -> bool:
        """Let a drained node take work again (its quarantined GPUs stay out); False if it was not draining.
        node.undrained goes out with the change: alerting's incidents forget their drains there, and a rebuild
        knows the drain is over."""
        store = self.s.store
        current = (await store.conditions()).get(node_key)
        if current is None or current.state != "draining":
            return False
        reg = (await store.registrations())[node_key]
        await store.set_condition(node_key, None, NodeUndrained(cluster=reg.cluster, node=reg.node), self.s.clock())
        await self.s.publish_staged()
        self.s.dirty.set()
        return True

    async def liveness(self) -> Liveness:
        """Who is suspect or lost now, every registered node by its last heartbeat, or its registration if never
        heard (`judged_from`); lost and draining nodes are out already (a drained node holds no jobs to move)."""
        store = self.s.store
        conditions = await store.conditions()
        registered = await store.node_keys()
        # As heard by this process; a node not heard since we started is judged by what is recorded
        # (and never blamed for the time we were not watching: see `watching_since`).
        heard = {**(await store.last_seen()), **self._heard}
        # An unhealthy node still heartbeats, and is judged by them like any other: it too can go silent.
        out = {key for key, c in conditions.items() if c.state != "unhealthy"}
        seen = judged_from(registered, heard, self._registered, out)
        return assess(seen, self.s.clock().timestamp(), self.watching_since, self.policy)

    async def check_liveness(self) -> Liveness:
        """Declare silent nodes lost and requeue their jobs, unless most of the fleet went silent."""
        async with self.s.lock:
            live = await self.liveness()
            since = watch_start(self._mass_silence_logged, live, self.watching_since, self.s.clock().timestamp())
            if since != self.watching_since:
                self.s.log.warning("nodes.mass_silence_over", still_silent=sorted(live.silent_ages),
                                   note=f"they get {self.s.settings.heartbeat_lost_s:g} s afresh")
                self.watching_since = since
                live = await self.liveness()
            if live.mass_silence:
                if not self._mass_silence_logged:
                    self.s.log.error("nodes.mass_silence", silent=sorted(live.held_back), note="rescheduling nothing")
                    self._mass_silence_logged = True
                return live
            self._mass_silence_logged = False
            await self._declare_lost(live)
        if live.lost:
            await self.s.publish_staged()
            self.s.dirty.set()
        return live

    async def _declare_lost(self, live: Liveness) -> None:
        settings, store, now = self.s.settings, self.s.store, self.s.clock()
        regs = await store.registrations()
        for key in sorted(live.lost):
            hold_s = node_hold_s(settings.hold_s, settings.heartbeat_lost_s, regs.get(key))
            age = live.silent_ages[key]
            reason = f"node lost: no heartbeat for {age:.0f} s"
            await store.set_condition(key, NodeCondition(state="lost", reason=reason, since=now))
            jobs = await store.jobs_on(key)
            for job in jobs:
                # The stop order waits in the node's consumer in case it comes back. Its attempt may
                # still run there (only the agent died): its supervisor stops it once the agent has been
                # silent for fence_after_s, so the job is held until then, never run twice; an attempt not
                # started yet is held from its start-by, the latest its node may start it.
                await store.requeue(job, "node_lost", reason, now, settings.preemption_grace_s,
                                    hold_until=lost_hold(job, now, hold_s))
            self.s.log.error("node.lost", node=key, silent_s=round(age, 1), jobs_requeued=len(jobs))

    async def liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.s.settings.heartbeat_suspect_s / 2))
            if not self.s.deciding:
                # Heartbeats wait in the bus while the store is down: silence meanwhile is ours, not the nodes'.
                self.watch_afresh()
                continue
            try:
                self.suspects = (await self.check_liveness()).suspect
            except TROUBLE as exc:
                self.s.log.error("liveness.check_failed", error=repr(exc))
