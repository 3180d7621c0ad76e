"""A pass of the queue policy: the store read into a `ScheduleRequest`, `queueing.schedule`, the reply applied.

A pass runs whenever something changed and every `pass_interval_s`, under the
scheduler's lock; it decides nothing while the store is down or being rebuilt.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from .failover import Failover
from .feeds import Feeds
from .pass_state import PassState
from .placement import NodeState, Profile, explain_wait
from .queueing import ScheduleReply, ScheduleRequest, schedule
from .schedule_request import NodeView, job_request, largest_lacks
from .service import TROUBLE, Scheduler

# How many jobs a pass did not reach still get a full "why" each pass (it costs a scan of the nodes each).
EXPLAIN_UNEXAMINED = 50


@dataclass(frozen=True)
class PassInput:
    """What a pass decides on: the policy's request and the queue in submission order."""

    request: ScheduleRequest
    pending_ids: list[str]


def waiting_reasons(reply: ScheduleReply, given: PassInput, profile: Profile) -> dict[str, str]:
    """Why each queued job still waits after the pass: the policy's answer, a full one for the first few it
    did not examine (nothing free), a short one for the rest."""
    request = given.request
    queue, cluster = request.queue, request.cluster
    waiting = dict(reply.waiting)
    for job_id in [j for j in given.pending_ids if j in queue and j not in waiting][:EXPLAIN_UNEXAMINED]:
        pending = queue.get(job_id)
        if pending is not None:
            waiting[job_id] = explain_wait(cluster, pending.request, profile, request.now)
    not_reached = "no GPU free" if cluster.total_free == 0 else "not reached in this pass"
    return {j: waiting.get(j, not_reached) for j in given.pending_ids if j in queue}


class PlacementPass:
    """Runs the queue policy over the whole queue and commits what it decided."""

    def __init__(self, scheduler: Scheduler, feeds: Feeds, failover: Failover):
        self.s = scheduler
        self.feeds = feeds
        self.failover = failover
        self._waiting: dict[str, str] = {}  # the reasons last stored, so a pass writes only what changed
        self.kept = PassState(scheduler.policy)  # the queue, running jobs and node states, kept across passes

    def forget_reasons(self) -> None:
        """After a rebuild the stored reasons are gone: the next pass writes them all (and builds all afresh)."""
        self._waiting = {}
        self.kept.reset()

    async def run(self) -> int:
        """One pass; returns how many jobs were placed."""
        async with self.s.lock:
            now = self.s.clock()
            given = await self._read(now)
            if given is None:  # nothing queued, nothing running: nothing to decide (nodes registering, say)
                reply, reasons = ScheduleReply(), {}
            else:
                try:
                    # In a thread: a long pass must not starve the event loop (lease renewal, HTTP) of the GIL.
                    reply = await asyncio.to_thread(schedule, given.request)
                except BaseException:
                    self.kept.reset()  # the queue it changed part-way is built afresh
                    raise
                self.kept.passed(reply)
                await self._apply(reply, now, list(given.request.cluster.nodes.values()))
                reasons = waiting_reasons(reply, given, self.s.policy.profile)
        # Outside the lock, and only what changed: a reason is not a decision, and rewriting every
        # pending job each pass made the pass cost the queue's length in round trips.
        changed = {j: why for j, why in reasons.items() if self._waiting.get(j) != why}
        gone = [j for j in self._waiting if j not in reasons]
        await self.s.store.set_waiting(changed, gone)
        self._waiting = reasons
        if reply.started or reply.preempted or reply.migrated or reply.infeasible:
            await self.s.publish_staged()
        return len(reply.started)

    async def _read(self, now: datetime) -> PassInput | None:
        store = self.s.store
        alloc = await store.alloc()
        pending_ids = await store.pending_ids()
        if not pending_ids and not alloc:
            return None
        regs = await store.registrations()
        conditions = await store.conditions()
        active_ids = sorted(set(alloc.values()))
        # Read only (the cache's own objects while leading): a job the pass changes is re-read as a copy.
        records = await store.jobs_shared(pending_ids + active_ids)
        stale = [j for j in pending_ids if j not in records or records[j].state != "pending"]
        await store.unqueue(stale)
        await asyncio.sleep(0)  # what follows is seconds of a loaded core at 1,000 nodes: lease renewal first

        free, leases, suspects = self.feeds.measured_free(), self.feeds.leases, self.failover.suspects
        out = frozenset(await self.feeds.health.quarantined()) if self.feeds.health is not None else frozenset()
        idle = self.feeds.idle_free()
        views = [NodeView(reg, conditions.get(key), key in suspects, free, leases.get(reg.node), out, idle)
                 for key, reg in sorted(regs.items())]
        kept = self.kept
        cluster = kept.cluster(kept.node_states(views, alloc), self.s.facts)
        # A moved job waits out its old attempt's stop (never two copies): not in this pass.
        queue = kept.sync_queue(records, pending_ids, now)
        running = kept.sync_running(records, active_ids, cluster, now.timestamp())
        request = ScheduleRequest(now.timestamp(), cluster, queue, running, self.s.policy, self.s.teams)
        return PassInput(request, pending_ids)

    async def _apply(self, reply: ScheduleReply, now: datetime, nodes: list[NodeState]) -> None:
        """Victims first: their stop orders go out before placements reuse their GPUs. A stopped job
        waits for its old attempt to end before it is placed again (never two copies). A rejected job's
        reason names the largest node and what it lacks, as a refusal at submission does."""
        store, log = self.s.store, self.s.log
        grace, hold = self.s.settings.preemption_grace_s, self.s.settings.stop_hold(now)
        changed = await store.jobs([p.victim for p in reply.preempted] + [m.job_id for m in reply.migrated]
                                   + [s.job.job_id for s in reply.started] + list(reply.infeasible))
        for p in reply.preempted:
            await store.requeue(changed[p.victim], "preempted", p.reason, now, grace, hold_until=hold)
            log.info("job.preempted", job_id=p.victim, for_job=p.for_job, reason=p.reason)
        # Moves are preemptions too (stop order, requeue, resume from the checkpoint). The policy's new
        # placement is not kept: a later pass places the job once its old attempt has stopped.
        for m in reply.migrated:
            await store.requeue(changed[m.job_id], "preempted", m.reason, now, grace, hold_until=hold, moved=True)
            log.info("job.migrated", job_id=m.job_id, to=m.placement.node, model=m.placement.model, reason=m.reason)
        placed = [(changed[s.job.job_id], s.placement, s.expected_end) for s in reply.started]
        await store.commit_placements(placed, now, self.s.settings.placement_report_s)
        for s in reply.started:
            job = changed[s.job.job_id]
            log.info("job.placed", job_id=job.job_id, node=job.node, gpus=list(s.placement.gpu_indices),
                     attempt=job.attempt, backfilled=s.backfilled, gang=job.nodes if job.parts else None)
        for job_id, reason in reply.infeasible.items():
            job = changed[job_id]
            if nodes:
                reason = f"{reason}; {largest_lacks(nodes, job_request(job_id, job.spec, job.estimate_left_s))}"
            await store.reject(job, reason, now)
            log.info("job.rejected", job_id=job_id, reason=reason)

    async def loop(self) -> None:
        """A pass whenever something changed, and every `pass_interval_s`."""
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that meets the
                # event being set (a job's end handled as the service stops), and this loop then never ends.
                async with asyncio.timeout(self.s.settings.pass_interval_s):
                    await self.s.dirty.wait()
            except TimeoutError:
                pass
            self.s.dirty.clear()
            if not self.s.deciding:
                continue  # nothing is decided on a store that is down or being rebuilt
            try:
                await self.run()
            except TROUBLE as exc:
                self.s.log.error("placement.pass_failed", error=repr(exc))
                await asyncio.sleep(1.0)
