"""`PassState`: the queue, running jobs and node states kept across passes decide as ones built afresh."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.scheduler.pass_state import PassState
from whaleflux.scheduler.placement import ClusterState, ModelFacts
from whaleflux.scheduler.queueing import (
    PendingQueue,
    PolicyConfig,
    RunningJobs,
    ScheduleReply,
    ScheduleRequest,
    schedule,
)
from whaleflux.scheduler.records import ACTIVE, JobRecord, NodeCondition
from whaleflux.scheduler.schedule_request import NodeView, held, node_state, pending_job, running_job
from whaleflux.scheduler.settings import SchedulerSettings
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuIdentity, JobSubmitted, NodeRegistered

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, tzinfo=UTC)
FACTS = {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}
POLICY = SchedulerSettings(environment="development").policy_config()
# Without moves a pass keeps its cluster state (weighing moves changes it: the next pass builds it afresh).
NO_MOVES = SchedulerSettings(environment="development", migration=False).policy_config()
CLASSES = ["small", "finetune", "llm-train", "inference"]


def _reg(node: str, model: str, gpus: int) -> NodeRegistered:
    ids = [GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=81559)
           for i in range(gpus)]
    return NodeRegistered(cluster="c1", node=node, interconnect="nvlink", agent_version="t", gpus=ids)


# Several nodes of a model: the placement core walks them in fleet order, which a kept state must keep.
REGS = {f"c1/{r.node}": r for r in (_reg("h100-01", "H100", 8), _reg("h100-02", "H100", 8), _reg("h100-03", "H100", 4),
                                    _reg("a100-01", "A100", 8), _reg("a100-02", "A100", 8),
                                    _reg("r4090-01", "RTX4090", 4))}


class World:
    """The store as a pass reads it: records replaced (never changed in place) whenever written."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.now = T0
        self.records: dict[str, JobRecord] = {}
        self.alloc: dict[str, str] = {}
        self.conditions: dict[str, NodeCondition] = {}
        self.suspects: set[str] = set()
        self.free: dict[str, float] = {}
        self.out: frozenset[str] = frozenset()
        self.leases: dict[str, float] = {}
        self.seq = 0

    def pending_ids(self) -> list[str]:
        pending = [r for r in self.records.values() if r.state == "pending"]
        return [r.job_id for r in sorted(pending, key=lambda r: (r.submitted_at.timestamp(), r.job_id))]

    def active_ids(self) -> list[str]:
        return sorted(set(self.alloc.values()))

    def views(self) -> list[NodeView]:
        return [NodeView(reg, self.conditions.get(key), key in self.suspects, self.free, self.leases.get(reg.node),
                         self.out) for key, reg in sorted(REGS.items())]

    def submit(self) -> None:
        rng = self.rng
        self.seq += 1
        job_id = f"j{self.seq:03d}"
        # Equal submit times now and then: ties go by id, as the store's queue orders them.
        at = self.now - timedelta(seconds=rng.choice([0, 0, 1, 30]))
        spec = JobSubmitted(job_id=job_id, name=job_id, command=["true"], gpus=rng.choice([1, 1, 2, 4, 8]),
                            team=rng.choice(["a", "b"]), priority=rng.choice(["normal", "normal", "high", "low"]),
                            workload_class=rng.choice(CLASSES), preemptible=rng.random() < 0.5,
                            resume=rng.choice(["checkpoint", "restart"]),
                            expected_runtime_s=rng.choice([None, 60.0, 7200.0]))
        self.records[job_id] = JobRecord(job_id=job_id, spec=spec, submitted_at=at)

    def apply(self, reply: ScheduleReply) -> None:
        """Commit what the pass decided, as `PlacementPass._apply` does (moves and preemptions requeue)."""
        for s in reply.started:
            uuids = [f"{share.node}-{i}" for share in s.placement.shares for i in share.gpu_indices]
            job = self.records[s.job.job_id]
            self.records[job.job_id] = job.model_copy(update=dict(
                state="placed", cluster="c1", node=s.placement.shares[0].node, gpu_uuids=uuids, placed_at=self.now,
                expected_end=s.expected_end, attempt=job.attempt + 1))
            self.alloc.update({u: job.job_id for u in uuids})
        for job_id in reply.infeasible:
            self.records[job_id] = self.records[job_id].model_copy(update=dict(state="rejected"))
        for job_id in [p.victim for p in reply.preempted] + [m.job_id for m in reply.migrated]:
            self.requeue(job_id, hold=True)

    def requeue(self, job_id: str, hold: bool) -> None:
        job = self.records[job_id]
        self.alloc = {u: j for u, j in self.alloc.items() if j != job_id}
        held_until = self.now + timedelta(seconds=5) if hold else None
        self.records[job_id] = job.model_copy(update=dict(state="pending", gpu_uuids=[], node=None,
                                                          held_until=held_until, preemptions=job.preemptions + 1))

    def churn(self) -> None:
        """One random change of the kind the store sees between passes."""
        rng = self.rng
        action = rng.choice(["submit", "submit", "start", "finish", "finish", "finish", "requeue", "node", "memory",
                             "time", "cancel", "edit"])
        active = [self.records[j] for j in self.active_ids()]
        if action == "submit":
            for _ in range(rng.randint(1, 4)):
                self.submit()
        elif action == "start" and active:
            job = rng.choice(active)
            if job.state == "placed":
                self.records[job.job_id] = job.model_copy(update=dict(state="running", started_at=self.now))
        elif action == "finish" and active:
            job = rng.choice(active)
            self.alloc = {u: j for u, j in self.alloc.items() if j != job.job_id}
            self.records[job.job_id] = job.model_copy(update=dict(state="succeeded", gpu_uuids=[]))
        elif action == "requeue" and active:
            self.requeue(rng.choice(active).job_id, hold=rng.random() < 0.5)
        elif action == "node":
            key = rng.choice(sorted(REGS))
            pick = rng.choice(["suspect", "drain", "heal", "quarantine", "lease"])
            if pick == "suspect":
                self.suspects ^= {key}
            elif pick == "drain":
                self.conditions[key] = NodeCondition(state="draining", reason="x", since=self.now)
            elif pick == "heal":
                self.conditions.pop(key, None)
            elif pick == "quarantine":
                gpu = rng.choice(REGS[key].gpus).uuid
                self.out = self.out ^ {gpu}
            else:
                self.leases[REGS[key].node] = self.now.timestamp() + rng.choice([600.0, 36000.0])
        elif action == "memory":
            gpu = rng.choice(rng.choice(list(REGS.values())).gpus).uuid
            self.free[gpu] = rng.choice([100.0, 40000.0, 81000.0])
        elif action == "time":
            # Far enough, now and then, for jobs without an estimate to pass their assumed end.
            self.now += timedelta(seconds=rng.choice([1, 5, 3600, 7 * 3600]))
        elif action in ("cancel", "edit") and self.pending_ids():
            job = self.records[rng.choice(self.pending_ids())]
            if action == "cancel":
                self.records[job.job_id] = job.model_copy(update=dict(state="cancelled"))
            else:  # a queued job's record written again (here its priority): its queue entry follows
                spec = job.spec.model_copy(update=dict(priority=rng.choice(["high", "low"])))
                self.records[job.job_id] = job.model_copy(update=dict(spec=spec))


def fresh_request(w: World, policy: PolicyConfig = POLICY) -> ScheduleRequest:
    """The request built afresh from the store, as every pass used to."""
    cluster = ClusterState([node_state(v, w.alloc) for v in w.views()], FACTS)
    queue = PendingQueue(policy)
    for seq, job_id in enumerate(w.pending_ids()):
        if not held(w.records[job_id], w.now):
            queue.add(pending_job(w.records[job_id], seq))
    running = {j: running_job(w.records[j], cluster, w.now.timestamp())
               for j in w.active_ids() if w.records[j].state in ACTIVE}
    return ScheduleRequest(w.now.timestamp(), cluster, queue, running, policy)


def kept_request(w: World, kept: PassState, policy: PolicyConfig = POLICY) -> ScheduleRequest:
    cluster = kept.cluster(kept.node_states(w.views(), w.alloc), FACTS)
    queue = kept.sync_queue(w.records, w.pending_ids(), w.now)
    running = kept.sync_running(w.records, w.active_ids(), cluster, w.now.timestamp())
    return ScheduleRequest(w.now.timestamp(), cluster, queue, running, policy)


def assert_same_cluster(ours: ClusterState, fresh: ClusterState) -> None:
    """A kept cluster state is one built afresh, down to the orders the placement core walks."""
    assert list(ours.nodes) == list(fresh.nodes) and ours.gpus == fresh.gpus and ours.free == fresh.free
    assert {m: [list(b) for b in bs] for m, bs in ours.buckets.items()} == {
        m: [list(b) for b in bs] for m, bs in fresh.buckets.items()}
    assert ours.holdings == fresh.holdings
    assert {n: list(j) for n, j in ours.jobs_on.items()} == {n: list(j) for n, j in fresh.jobs_on.items()}
    assert (ours.total_free, ours.free_by_model, ours.total_gpus) == (fresh.total_free, fresh.free_by_model,
                                                                      fresh.total_gpus)
    assert {n: +c for n, c in ours.services_on.items()} == {n: +c for n, c in fresh.services_on.items()}
    assert (ours.has_leases, ours.has_memory_telemetry) == (fresh.has_leases, fresh.has_memory_telemetry)
    assert (ours.memory, ours.memory_floor) == (fresh.memory, fresh.memory_floor)


def decisions(reply: ScheduleReply) -> tuple[object, ...]:
    """What a pass decided (a queued job's `seq` aside: the kept queue orders ties by id, as the store does)."""
    started = [(s.job.job_id, s.job.request, s.placement, s.expected_end, s.backfilled) for s in reply.started]
    return (started, reply.preempted, reply.infeasible, reply.waiting, reply.migrated)


@pytest.mark.parametrize("policy", [POLICY, NO_MOVES], ids=["moves", "no-moves"])
@pytest.mark.parametrize("seed", range(12))
def test_kept_state_decides_every_pass_as_state_built_afresh(seed: int, policy: PolicyConfig):
    w, kept = World(random.Random(seed)), PassState(policy)
    for _ in range(8):
        w.submit()
    passes_with_starts = 0
    for _ in range(200):
        fresh, ours = fresh_request(w, policy), kept_request(w, kept, policy)
        assert isinstance(ours.running, RunningJobs)
        assert ours.running == fresh.running
        assert ours.running.usage == RunningJobs(fresh.running.values()).usage
        assert [n for n in ours.cluster.nodes.values()] == [n for n in fresh.cluster.nodes.values()]
        assert_same_cluster(ours.cluster, fresh.cluster)
        order = [j.job_id for j in fresh.queue.ordered({}, {}, w.now.timestamp())]
        assert [j.job_id for j in ours.queue.ordered({}, {}, w.now.timestamp())] == order
        expected, reply = schedule(fresh), schedule(ours)
        kept.passed(reply)
        assert decisions(reply) == decisions(expected)
        passes_with_starts += bool(reply.started)
        w.apply(reply)
        w.churn()
    assert passes_with_starts >= 5, "the run exercised placements"


def test_a_kept_node_state_is_reused_until_its_view_or_holders_change():
    w, kept = World(random.Random(0)), PassState(POLICY)
    first = kept.node_states(w.views(), w.alloc)
    again = kept.node_states(w.views(), w.alloc)
    assert all(a is b for a, b in zip(first, again, strict=True))
    w.alloc["h100-01-3"] = "x"
    changed = kept.node_states(w.views(), w.alloc)
    names = [n.name for a, n in zip(first, changed, strict=True) if a is not n]
    assert names == ["h100-01"] and next(n for n in changed if n.name == "h100-01").gpus[3].allocated_to == "x"


def test_reset_builds_everything_afresh():
    w, kept = World(random.Random(1)), PassState(POLICY)
    for _ in range(5):
        w.submit()
    queue = kept.sync_queue(w.records, w.pending_ids(), w.now)
    nodes = kept.node_states(w.views(), w.alloc)
    kept.reset()
    assert kept.sync_queue(w.records, w.pending_ids(), w.now) is not queue
    assert len(kept.queue) == 5 and kept.node_states(w.views(), w.alloc)[0] is not nodes[0]
