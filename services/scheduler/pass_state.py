"""What a pass builds from the store, kept across passes and rebuilt only where its inputs changed. Pure.

A pass needs the queue (`PendingQueue`), the running jobs (`RunningJobs`), a
node state per registered node and the cluster state built from them
(`ClusterState`, whose cached views outlive a pass where no node's health changed:
it is brought up to date only where allocations or nodes changed, orders included).
Built afresh from 10,000 queued jobs, 8,000 running ones and 1,000 nodes, that
was most of a live pass's cost. `PassState` keeps each object with the input it was built from and builds it again only
when that input changed: a job's record (the store's cache hands the pass the
same parsed object until the job is written: `jobs_shared`), a node's view and
allocations. The decisions are those of objects built afresh.

The pass changes the queue (it removes what it started or rejected): the
caller reports that with `passed`, and drops everything with `reset` when a
pass failed part-way or the store was rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from .placement import ClusterState, ModelFacts, NodeShare, NodeState, Placement
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
        self._cluster: ClusterState | None = None
        # Nodes whose GPUs the last pass allocated in the kept cluster (its commit may have failed), and the
        # jobs it started as services (a cluster built afresh knows no job's service).
        self._touched: set[str] = set()
        self._serviced: set[str] = set()
        self._changes = 0  # the kept cluster's change count once brought up to date

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
            kept = ran.get(job_id)
            if kept is not None and kept[0] is job and kept[1] is None and now <= kept[2]:
                continue  # the same record, not movable (its node's facts do not matter): the same view
            moves = bool(job.node) and movable(job)
            node = cluster.nodes.get(job.node) if moves and job.node else None
            # None only for a job that is not movable: its view never depends on the cluster.
            facts = (node.cluster, node.model, node.interconnect) if node is not None else (() if moves else None)
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
                   tuple(u in view.quarantined for u in uuids) if view.quarantined else (),
                   tuple(view.memory_idle_mib.get(u) for u in uuids) if view.memory_idle_mib else ())
            kept = nodes.get(view.key)
            if kept is None or not _same(kept[0], key):
                kept = nodes[view.key] = (key, node_state(view, alloc))
            out.append(kept[1])
            seen.add(view.key)
        for name in [n for n in nodes if n not in seen]:
            del nodes[name]
        return out

    def cluster(self, states: list[NodeState], facts: Mapping[str, ModelFacts]) -> ClusterState:
        """The cluster state of these node states: the last pass's, brought up to date where a node's state
        changed or the pass allocated on it, exactly as one built afresh (orders included)."""
        c = self._cluster
        if c is None or len(c.nodes) != len(states) or any(a != n.name for a, n in zip(c.nodes, states, strict=True)):
            return self._fresh(states, facts)
        by_name = {n.name: n for n in states}
        stale = {n.name for n in states if c.nodes[n.name] is not n} | self._touched
        if not stale:  # (a job started as a service touched its nodes too)
            return self._synced(c)
        updated = False
        for name in sorted(stale, key=c.order.__getitem__):
            old, new = c.nodes[name], by_name[name]
            if old is new:
                continue
            if len(old.gpus) != len(new.gpus) or any(a.index != b.index or a.quarantined != b.quarantined
                                                     for a, b in zip(old.gpus, new.gpus, strict=True)):
                return self._fresh(states, facts)  # its free GPUs are counted anew
            if replace(old, gpus=()) != replace(new, gpus=()) or any(
                    replace(a, allocated_to=None) != replace(b, allocated_to=None)
                    for a, b in zip(old.gpus, new.gpus, strict=True)):
                c.update_node(new)  # health, labels, memory: the cached views go
                updated = True
            else:  # only its GPUs' holders changed
                c.nodes[name], c.gpus[name] = new, {g.index: g for g in new.gpus}
        held_on: dict[str, set[str]] = {j: set() for name in stale for j in c.jobs_on[name]}  # job -> stale nodes
        for j in self._serviced:
            held_on.setdefault(j, set())
        for name in stale:
            for g in by_name[name].gpus:
                if g.allocated_to is not None:
                    held_on.setdefault(g.allocated_to, set()).add(name)
        wanted = {j: _holding(c, by_name, held_on[j], j) for j in sorted(held_on)}
        for j, shares in wanted.items():
            if c.holdings.get(j) != shares or j in self._serviced:
                c.release(j)
        for j, shares in wanted.items():
            if shares and j not in c.holdings:
                first = shares[0]
                c.allocate(j, Placement(first.node, first.cluster, first.model, first.gpu_uuids, first.gpu_indices,
                                        others=shares[1:]))
        for name in stale:  # in the order of their GPUs, as built afresh
            c.jobs_on[name] = dict.fromkeys(g.allocated_to for g in by_name[name].gpus if g.allocated_to is not None)
        for buckets in c.buckets.values():  # fleet order, as built afresh (best fit walks them in order)
            for i, bucket in enumerate(buckets):
                buckets[i] = dict.fromkeys(sorted(bucket, key=c.order.__getitem__))
        if updated:
            c.has_leases = any(n.lease_expires_at is not None for n in states)
            c.has_memory_telemetry = any(g.memory_free_mib is not None for n in states for g in n.gpus)
        return self._synced(c)

    def _fresh(self, states: list[NodeState], facts: Mapping[str, ModelFacts]) -> ClusterState:
        self._cluster = ClusterState(states, facts)
        return self._synced(self._cluster)

    def _synced(self, c: ClusterState) -> ClusterState:
        self._touched, self._serviced, self._changes = set(), set(), c.changes
        return c

    def passed(self, reply: ScheduleReply) -> None:
        """The pass took its started and rejected jobs out of the queue: so does the bookkeeping. It changed
        the cluster state too: where it started jobs, the next pass checks that against the store; if it did
        more (preempted, moved), the next pass builds it afresh."""
        for s in reply.started:
            self._queued.pop(s.job.job_id, None)
            self._touched.update(share.node for share in s.placement.shares)
            if s.job.request.service:
                self._serviced.add(s.job.job_id)
        for job_id in reply.infeasible:
            self._queued.pop(job_id, None)
        c = self._cluster
        if c is not None and c.changes - self._changes != len(reply.started):
            # More than one allocation per started job: it preempted, moved, or moved and put back.
            self._cluster = None


def _holding(c: ClusterState, states: Mapping[str, NodeState], on: set[str], job_id: str) -> tuple[NodeShare, ...]:
    """The GPUs the job holds by the node states, as a cluster state built afresh lists them: on the changed
    nodes `on` that list it, and on the nodes the kept cluster has it on (those that did not change hold it still)."""
    nodes = on | {s.node for s in c.holdings.get(job_id, ())}
    out = []
    for name in sorted(nodes, key=c.order.__getitem__):
        node = states[name]
        gpus = [g for g in node.gpus if g.allocated_to == job_id]
        if gpus:
            out.append(NodeShare(name, node.cluster, node.model, tuple(g.uuid for g in gpus),
                                 tuple(g.index for g in gpus)))
    return tuple(out)


def _same(a: NodeKey, b: NodeKey) -> bool:
    """Equal keys; the registration and condition by identity (the store's cache keeps them until written)."""
    return a[0] is b[0] and a[1] is b[1] and a[2:] == b[2:]

