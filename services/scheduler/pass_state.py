"""What a pass builds from the store, kept across passes and rebuilt only where its inputs changed. Pure.

A pass needs the queue (`PendingQueue`), the running jobs (`RunningJobs`) and a
node state per registered node. Built afresh from 10,000 queued jobs, 8,000
running ones and 1,000 nodes, that was most of a live pass's cost. `PassState`
keeps each object with the input it was built from and builds it again only
when that input changed: a job's record (the store's cache hands the pass the
same parsed object until the job is written: `jobs_shared`), a node's view and
allocations. The decisions are those of objects built afresh.

The pass changes the queue (it removes what it started or rejected): the
caller reports that with `passed`, and drops everything with `reset` when a
pass failed part-way or the store was rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from .placement import ClusterState, NodeState
from .queueing import PendingQueue, PolicyConfig, RunningJobs, ScheduleReply
from .records import ACTIVE, JobRecord
from .schedule_request import NodeView, assumed_until, held, movable, node_state, pending_job, running_job

# What a node's state is built from: its view's parts, each GPU's measured free memory, holder and quarantine.
NodeKey = tuple[object, ...]


class PassState:
    """The queue, the running jobs and the node states of the last pass, brought up to date for the next."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next pass builds it all afresh."""
        self.queue = PendingQueue(self.policy)
        self.running = RunningJobs()
        self._queued: dict[str, JobRecord] = {}  # job id -> the record its queue entry was built from
        # job id -> (the record, the node facts a movable job's speed came from, valid until (epoch s))
        self._ran: dict[str, tuple[JobRecord, object, float]] = {}
        self._nodes: dict[str, tuple[NodeKey, NodeState]] = {}

    def sync_queue(self, records: Mapping[str, JobRecord], pending_ids: Iterable[str], now: datetime) -> PendingQueue:
        """The queue of pending jobs that may be placed now (a held one waits out its old attempt's stop)."""
        queue, queued = self.queue, self._queued
        wanted: set[str] = set()
        for job_id in pending_ids:
            job = records.get(job_id)
            if job is None or job.state != "pending" or held(job, now):
                continue
            wanted.add(job_id)
            if queued.get(job_id) is not job:
                queue.remove(job_id)
                # Order by (submit time, id), as the store's queue is: the same order the pass always used.
                queue.add(pending_job(job, 0))
                queued[job_id] = job
        for job_id in [j for j in queued if j not in wanted]:
            queue.remove(job_id)
            del queued[job_id]
        return queue

    def sync_running(self, records: Mapping[str, JobRecord], active_ids: Iterable[str], cluster: ClusterState,
                     now: float) -> RunningJobs:
        """The active jobs as the policy sees them (`running_job`), each built again only when it changed."""
        running, ran = self.running, self._ran
        active: set[str] = set()
        for job_id in active_ids:
            job = records.get(job_id)
            if job is None or job.state not in ACTIVE:
                continue
            active.add(job_id)
            node = cluster.nodes.get(job.node) if job.node and movable(job) else None
            facts = (node.cluster, node.model, node.interconnect) if node is not None else None
            kept = ran.get(job_id)
            if kept is None or kept[0] is not job or kept[1] != facts or now > kept[2]:
                running[job_id] = running_job(job, cluster, now)
                ran[job_id] = (job, facts, assumed_until(job))
        for job_id in [j for j in ran if j not in active]:
            del running[job_id]
            del ran[job_id]
        return running

    def node_states(self, views: Iterable[NodeView], alloc: Mapping[str, str]) -> list[NodeState]:
        """Each view's node state, built again only when the view or its GPUs' holders changed."""
        nodes = self._nodes
        out, seen = [], set()
        for view in views:
            reg = view.registration
            uuids = [g.uuid for g in reg.gpus]
            free = view.memory_free_mib
            key = (reg, view.condition, view.suspect, view.lease_expires_at,
                   tuple(free.get(u) for u in uuids), tuple(alloc.get(u) for u in uuids),
                   tuple(u in view.quarantined for u in uuids) if view.quarantined else ())
            kept = nodes.get(view.key)
            if kept is None or not _same(kept[0], key):
                kept = nodes[view.key] = (key, node_state(view, alloc))
            out.append(kept[1])
            seen.add(view.key)
        for name in [n for n in nodes if n not in seen]:
            del nodes[name]
        return out

    def passed(self, reply: ScheduleReply) -> None:
        """The pass took its started and rejected jobs out of the queue: so does the bookkeeping."""
        for s in reply.started:
            self._queued.pop(s.job.job_id, None)
        for job_id in reply.infeasible:
            self._queued.pop(job_id, None)


def _same(a: NodeKey, b: NodeKey) -> bool:
    """Equal keys; the registration and condition by identity (the store's cache keeps them until written)."""
    return a[0] is b[0] and a[1] is b[1] and a[2:] == b[2:]

