"""Queue policy core (`schedule(request) -> reply`): pure decisions, no I/O."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import ClusterState, GpuState, JobRequest, ModelFacts, NodeState, Placement
from whaleflux.scheduler.queueing import (
    BACKFILL,
    FIFO,
    WHALEFLUX,
    PendingJob,
    PendingQueue,
    RunningJob,
    ScheduleRequest,
    TeamPolicy,
    schedule,
)
from whaleflux.scheduler.queueing.reservation import reserve

ONE_NODE_POLICY = replace(WHALEFLUX, preemption=False)


def nodes(*sizes, model="A100"):
    return [
        NodeState(f"n{i}", "c", model, "nvlink", tuple(GpuState(f"n{i}-g{g}", g, 81920) for g in range(size)))
        for i, size in enumerate(sizes)
    ]


def job(job_id, gpus=1, t=0.0, runtime=100.0, team="t", priority="normal", preemptible=False, multi=False):
    req = JobRequest(job_id, gpus, team=team, priority=priority, preemptible=preemptible,
                     expected_runtime_s=runtime, allow_multi_node=multi)
    return PendingJob(req, t)


class World:
    """A cluster, a queue and the running jobs, advanced by schedule() passes."""

    def __init__(self, policy, node_list, teams=None):
        self.policy, self.cluster, self.queue = policy, ClusterState(node_list), PendingQueue(policy)
        self.running: dict[str, RunningJob] = {}
        self.teams = teams or {}

    def submit(self, *jobs):
        for j in jobs:
            self.queue.add(j)

    def start_running(self, j: PendingJob, now=0.0, end=None):
        """Put a job on GPUs directly, as if an earlier pass had started it."""
        from whaleflux.scheduler.placement import place_on

        d = place_on(self.cluster, j.request, self.policy.profile, now)
        if not isinstance(d, Placement):
            raise ValueError(f"{j.job_id} does not fit: {d}")
        self.cluster.allocate(j.job_id, d)
        r = j.request
        self.running[j.job_id] = RunningJob(j.job_id, r.team, r.priority, r.preemptible, r.gpus, now, end)

    def step(self, now=0.0):
        reply = schedule(ScheduleRequest(now, self.cluster, self.queue, self.running, self.policy, self.teams))
        for p in reply.preempted:
            self.running.pop(p.victim)
        for s in reply.started:
            r = s.job.request
            self.running[s.job.job_id] = RunningJob(s.job.job_id, r.team, r.priority, r.preemptible, r.gpus, now,
                                                    s.expected_end)
        return reply

    def finish(self, job_id):
        self.running.pop(job_id)
        self.cluster.release(job_id)


def started(reply):
    return [s.job.job_id for s in reply.started]


def test_high_priority_job_starts_before_an_older_normal_one():
    w = World(ONE_NODE_POLICY, nodes(1))
    w.submit(job("old", t=0), job("urgent", t=5, priority="high"))
    assert started(w.step()) == ["urgent"]


def test_strict_fifo_lets_nothing_overtake_a_blocked_head():
    w = World(FIFO, nodes(8))
    w.start_running(job("running", gpus=4), end=1000)
    w.submit(job("big", gpus=8, t=1), job("small", gpus=1, t=2))
    reply = w.step()
    assert started(reply) == [] and "largest free block is 4" in reply.waiting["big"]


def test_backfill_starts_a_short_job_but_not_one_that_would_delay_the_head():
    w = World(BACKFILL, nodes(8))
    w.start_running(job("running", gpus=4), end=1000)
    w.submit(job("big", gpus=8, t=1), job("long", gpus=2, t=2, runtime=5000), job("short", gpus=2, t=3, runtime=500))
    reply = w.step()
    assert started(reply) == ["short"]
    assert reply.reservation.job_id == "big" and reply.reservation.start == 1000
    assert "would delay big" in reply.waiting["long"]


def test_backfill_never_delays_the_reserved_start_of_the_head():
    """Over random states: the head's reservation after a pass is no later than before it."""
    rng = random.Random(7)
    for trial in range(200):
        policy = rng.choice([BACKFILL, ONE_NODE_POLICY])
        w = World(policy, nodes(*[rng.choice([4, 8]) for _ in range(rng.randint(2, 5))]))
        for i in range(rng.randint(3, 12)):
            j = job(f"r{i}", gpus=rng.choice([1, 2, 4]), runtime=rng.uniform(100, 5000))
            d_free = w.cluster.total_free
            if d_free >= j.request.gpus:
                try:
                    w.start_running(j, end=rng.uniform(10, 5000))
                except ValueError:
                    pass  # did not fit on one node
        for i in range(rng.randint(2, 15)):
            w.submit(job(f"q{i}", gpus=rng.choice([1, 1, 2, 4, 8]), t=float(i), runtime=rng.uniform(10, 6000)))
        reply = w.step(now=0.0)
        res = reply.reservation
        if res is None or res.start is None:
            continue
        head = w.queue.get(res.job_id)
        assert head is not None
        after = reserve(w.cluster, head, w.running, policy.profile, 0.0)
        assert after.start is not None and after.start <= res.start, (trial, res, after)


def test_gang_job_starts_whole_or_not_at_all():
    w = World(ONE_NODE_POLICY, nodes(8, 8))
    w.start_running(job("holder", gpus=4), end=100)
    w.submit(job("gang", gpus=16, multi=True))
    reply = w.step()
    assert started(reply) == [] and "gang" not in w.cluster.holdings
    assert w.cluster.total_free == 12
    w.finish("holder")
    reply = w.step(now=100)
    assert started(reply) == ["gang"] and reply.started[0].placement.gpu_count == 16


def test_team_within_quota_goes_before_a_team_borrowing_above_its_own():
    teams = {"a": TeamPolicy(quota_gpus=2), "b": TeamPolicy(quota_gpus=2)}
    w = World(ONE_NODE_POLICY, nodes(8), teams)
    for i in range(4):
        w.start_running(job(f"b{i}", team="b"), end=1000)  # b borrows 2 above its quota
    w.submit(job("b-next", team="b", t=0), job("a-first", team="a", t=1))
    w.start_running(job("x1", team="c"), end=1000)
    w.start_running(job("x2", team="c"), end=1000)
    w.start_running(job("x3", team="c"), end=1000)
    assert started(w.step()) == ["a-first"]


def test_weighted_fair_share_alternates_between_teams():
    teams = {"a": TeamPolicy(weight=1.0), "b": TeamPolicy(weight=1.0)}
    w = World(ONE_NODE_POLICY, nodes(4), teams)
    w.submit(*[job(f"a{i}", team="a", t=i) for i in range(4)], *[job(f"b{i}", team="b", t=10 + i) for i in range(4)])
    assert sorted(started(w.step())) == ["a0", "a1", "b0", "b1"]


def test_high_priority_job_preempts_whole_low_priority_preemptible_jobs():
    w = World(WHALEFLUX, nodes(4))
    w.start_running(job("low1", gpus=2, priority="low", preemptible=True), end=5000)
    w.start_running(job("low2", gpus=2, priority="low", preemptible=True), now=-5000, end=5000)
    w.submit(job("urgent", gpus=2, priority="high"))
    reply = w.step(now=1000)
    assert [p.victim for p in reply.preempted] == ["low1"]  # the most recently started loses least work
    assert started(reply) == ["urgent"]
    assert "low priority, preempted for high job urgent" in reply.preempted[0].reason


def test_no_preemption_of_equal_priority_or_non_preemptible_or_young_jobs():
    w = World(WHALEFLUX, nodes(3))
    w.start_running(job("peer", priority="high", preemptible=True), end=5000)
    w.start_running(job("pinned", priority="low", preemptible=False), end=5000)
    w.start_running(job("young", priority="low", preemptible=True), now=900, end=5000)
    w.submit(job("urgent", priority="high"))
    reply = w.step(now=1000)  # "young" ran 100 s, under the 600 s guard
    assert reply.preempted == [] and started(reply) == []


def test_preempted_job_cannot_preempt_back_so_there_are_no_loops():
    w = World(WHALEFLUX, nodes(1))
    w.start_running(job("low", priority="low", preemptible=True), end=5000)
    w.submit(job("urgent", priority="high"))
    assert [p.victim for p in w.step(now=1000).preempted] == ["low"]
    w.submit(job("low", priority="low", preemptible=True))  # requeued
    for now in (2000, 3000, 4000):
        reply = w.step(now=now)
        assert reply.preempted == [] and started(reply) == []
    assert "urgent" in w.running


def test_team_under_quota_reclaims_lent_gpus_by_preemption():
    teams = {"a": TeamPolicy(quota_gpus=2), "b": TeamPolicy(quota_gpus=2)}
    w = World(WHALEFLUX, nodes(4), teams)
    for i in range(4):
        w.start_running(job(f"b{i}", team="b", preemptible=True), end=9000)
    w.submit(job("a1", team="a"))
    reply = w.step(now=1000)
    assert len(reply.preempted) == 1 and "reclaims" in reply.preempted[0].reason and started(reply) == ["a1"]
    # b is now at 3 > quota 2 and a at 1 < quota: b can never reclaim from a.
    w.submit(job("b-more", team="b"))
    assert w.step(now=2000).preempted == []


def test_infeasible_job_leaves_the_queue_with_its_reason():
    w = World(ONE_NODE_POLICY, nodes(8))
    w.submit(job("huge", gpus=16))
    reply = w.step()
    assert "only 8 GPUs per node" in reply.infeasible["huge"] and len(w.queue) == 0


def train(job_id, runtime):
    return PendingJob(JobRequest(job_id, 1, workload_class="llm-train", expected_runtime_s=runtime), 0.0)


# ---------------------------------------------------------------- migration to faster GPUs

MIGRATING = replace(
    ONE_NODE_POLICY, migrate_min_gain_s=1800.0, migrate_max_ratio=0.85,
    migration_overhead_s=60.0, max_migrations_per_job=2, make_room_by_migration=True, make_room_budget=1.0,
)
MODELS = {
    "A100": ModelFacts("A100", {"llm-train": 1.0}),
    "H100": ModelFacts("H100", {"llm-train": 2.6}),
    "H200": ModelFacts("H200", {"llm-train": 3.0}),
}


def model_nodes(*specs):
    """(name, model, GPUs, GB per GPU) -> nodes."""
    return [
        NodeState(name, "c", model, "nvlink", tuple(GpuState(f"{name}-g{g}", g, gb * 1024) for g in range(n)))
        for name, model, n, gb in specs
    ]


def on(w: World, j: PendingJob, node: str, now: float, end: float, checkpointable=True, migrations=0):
    """Run `j` on the first free GPUs of `node` (as an earlier pass would have), with what migration needs."""
    from whaleflux.scheduler.placement import place_on

    req = replace(j.request, gpu_models=(w.cluster.nodes[node].model,))
    d = place_on(w.cluster, req, w.policy.profile, now, caps={n: 0 for n in w.cluster.nodes if n != node})
    assert isinstance(d, Placement)
    w.cluster.allocate(j.job_id, d)
    r = j.request
    w.running[j.job_id] = RunningJob(j.job_id, r.team, r.priority, r.preemptible, r.gpus, now, end, request=r,
                                     speed=d.speed, checkpointable=checkpointable, migrations=migrations)


def big(job_id, gb, gpus=1, runtime=3600.0):
    return PendingJob(JobRequest(job_id, gpus, min_memory_mib=gb * 1024, workload_class="llm-train",
                                 expected_runtime_s=runtime), 0.0)


def migration_world(policy=MIGRATING):
    fleet = model_nodes(("a", "A100", 1, 80), ("h", "H100", 1, 80))
    w = World(policy, fleet)
    w.cluster = ClusterState(fleet, MODELS)
    return w


def test_long_job_on_a_slow_gpu_moves_to_a_faster_one_that_frees_when_the_gain_is_large():
    w = migration_world()
    on(w, train("busy", 100.0), "h", now=0.0, end=3600.0)
    on(w, train("long", 7 * 86400.0), "a", now=0.0, end=7 * 86400.0)
    assert w.step(now=1800.0).migrated == []  # the H100 is busy
    w.finish("busy")
    reply = w.step(now=3600.0)
    (m,) = reply.migrated
    left = 7 * 86400.0 - 3600.0
    assert m.job_id == "long" and m.placement.node == "h" and "migrate to faster GPUs" in m.reason
    assert m.expected_end == pytest.approx(3600.0 + 60.0 + left / 2.6)
    assert w.cluster.holdings["long"][0].node == "h" and w.cluster.free["a"] == [0]


def test_no_migration_when_the_gain_is_small_or_the_job_cannot_resume_from_a_checkpoint():
    w = migration_world()
    on(w, train("nearly-done", 3000.0), "a", now=0.0, end=3000.0)
    assert w.step(now=1000.0).migrated == []  # 2000 s left: 769 s + 60 s on the H100 saves < 30 min
    w = migration_world()
    on(w, train("pinned", 7 * 86400.0), "a", now=0.0, end=7 * 86400.0, checkpointable=False)
    assert w.step(now=1000.0).migrated == []
    w = migration_world()  # the gain ratio: H100 -> H200 is only 2.6/3.0 = 0.87 > 0.85
    w.cluster = ClusterState(model_nodes(("h", "H100", 1, 80), ("x", "H200", 1, 80)), MODELS)
    on(w, train("long", 7 * 86400.0), "h", now=0.0, end=7 * 86400.0)
    assert w.step(now=1000.0).migrated == []


def test_migrations_never_loop_and_stop_at_the_per_job_limit():
    fleet = model_nodes(("a1", "A100", 1, 80), ("a2", "A100", 1, 80), ("h", "H100", 1, 80))
    w = World(MIGRATING, fleet)
    w.cluster = ClusterState(fleet, MODELS)
    on(w, train("long", 7 * 86400.0), "a1", now=0.0, end=7 * 86400.0)
    (m,) = w.step(now=100.0).migrated
    w.running["long"] = replace(w.running["long"], expected_end=m.expected_end, speed=m.placement.speed, migrations=1)
    for now in (200.0, 300.0, 400.0):  # both A100s free: never back down, never sideways
        assert w.step(now=now).migrated == []
    w = World(MIGRATING, fleet)
    w.cluster = ClusterState(fleet, MODELS)
    on(w, train("moved-twice", 7 * 86400.0), "a1", now=0.0, end=7 * 86400.0, migrations=2)
    assert w.step(now=100.0).migrated == []


def test_migration_never_delays_the_reserved_start_of_the_head_job():
    fleet = model_nodes(("a", "A100", 1, 80), ("h", "H100", 8, 80))

    def world():
        w = World(MIGRATING, fleet)
        w.cluster = ClusterState(fleet, MODELS)
        on(w, train("long", 7 * 86400.0), "a", now=0.0, end=7 * 86400.0)
        holder = PendingJob(JobRequest("holder", 4, workload_class="llm-train", expected_runtime_s=1000.0), 0.0)
        on(w, holder, "h", now=0.0, end=1000.0)
        return w

    w = world()
    assert [m.job_id for m in w.step(now=10.0).migrated] == ["long"]  # nothing waits: it moves
    w = world()
    w.submit(PendingJob(JobRequest("head", 8, workload_class="llm-train", expected_runtime_s=3600.0), 0.0))
    reply = w.step(now=10.0)
    assert reply.migrated == [] and reply.reservation.job_id == "head" and reply.reservation.start == 1000.0
    after = reserve(w.cluster, w.queue.get("head"), w.running, MIGRATING.profile, 10.0)
    assert after.start == 1000.0


def test_a_job_that_fits_elsewhere_is_moved_off_the_only_gpu_a_blocked_job_can_use():
    fleet = model_nodes(("a", "A100", 1, 80), ("x", "H200", 1, 141))
    # It would wait 85,400 s; the mover loses 2 x 85,400 s + 60 s on the A100: within a budget of 4 x the wait.
    w = World(replace(MIGRATING, make_room_budget=4.0), fleet)
    w.cluster = ClusterState(fleet, MODELS)
    on(w, train("fits-80", 86400.0), "x", now=0.0, end=86400.0)
    w.submit(big("needs-100", 100))
    reply = w.step(now=1000.0)
    (m,) = reply.migrated
    assert m.job_id == "fits-80" and m.placement.node == "a" and "make room for needs-100" in m.reason
    assert started(reply) == ["needs-100"] and reply.started[0].placement.node == "x"
    # The moved job loses more time than the blocked one would wait: nothing moves.
    w = World(MIGRATING, fleet)
    w.cluster = ClusterState(fleet, MODELS)
    on(w, train("nearly-done", 86400.0), "x", now=0.0, end=1900.0)
    w.submit(big("needs-100", 100))
    reply = w.step(now=1000.0)  # 900 s wait vs 60 s + 1,800 s more on the A100 for the mover (budget 1)
    assert reply.migrated == [] and started(reply) == [] and reply.reservation.start == 1900.0
    assert w.cluster.holdings["nearly-done"][0].node == "x"


def test_room_for_a_gang_is_made_on_several_nodes_by_moving_jobs_to_nodes_it_cannot_use():
    fleet = model_nodes(("a", "A100", 4, 80), ("x1", "H200", 2, 141), ("x2", "H200", 2, 141))
    w = World(replace(MIGRATING, make_room_budget=4.0), fleet)
    w.cluster = ClusterState(fleet, MODELS)
    on(w, train("s1", 86400.0), "x1", now=0.0, end=86400.0)
    on(w, train("s2", 86400.0), "x2", now=0.0, end=86400.0)
    gang = big("gang", 100, gpus=4)
    w.submit(replace(gang, request=replace(gang.request, allow_multi_node=True)))
    reply = w.step(now=1000.0)
    assert sorted(m.job_id for m in reply.migrated) == ["s1", "s2"]
    assert {m.placement.node for m in reply.migrated} == {"a"}
    assert started(reply) == ["gang"] and reply.started[0].placement.gpu_count == 4


def test_moves_never_delay_the_reserved_start_of_the_head_over_random_states():
    rng = random.Random(11)
    moved = 0
    for trial in range(200):
        count = rng.randint(2, 5)
        specs = [(f"n{i}", rng.choice(["A100", "H100", "H200"]), rng.choice([2, 4, 8]), 80) for i in range(count)]
        fleet = model_nodes(*specs)
        w = World(replace(MIGRATING, make_room_budget=rng.choice([1.0, 12.0])), fleet)
        w.cluster = ClusterState(fleet, MODELS)
        for i in range(rng.randint(2, 10)):
            name, _, size, _ = rng.choice(specs)
            gpus = rng.choice([1, 2, 4])
            if len(w.cluster.free[name]) >= gpus:
                on(w, PendingJob(JobRequest(f"r{i}", gpus, workload_class="llm-train", expected_runtime_s=1e5), 0.0),
                   name, now=0.0, end=rng.uniform(100, 200_000))
        for _ in range(rng.randint(0, 3)):  # free some GPUs, as jobs ending would
            if w.running:
                w.finish(rng.choice(sorted(w.running)))
        for i in range(rng.randint(1, 8)):
            w.submit(PendingJob(JobRequest(f"q{i}", rng.choice([1, 2, 4, 8]), workload_class="llm-train",
                                           expected_runtime_s=rng.uniform(10, 50_000)), float(i)))
        reply = w.step(now=50.0)
        moved += len(reply.migrated)
        for m in reply.migrated:  # the cluster holds each moved job where the reply says
            assert w.cluster.holdings[m.job_id] == m.placement.shares
        res = reply.reservation
        if res is None or res.start is None:
            continue
        for m in reply.migrated:
            w.running[m.job_id] = replace(w.running[m.job_id], expected_end=m.expected_end, speed=m.placement.speed)
        queued = w.queue.get(res.job_id)
        assert queued is not None
        after = reserve(w.cluster, queued, w.running, MIGRATING.profile, 50.0)
        assert after.start is not None and after.start <= res.start, (trial, res, after)
    assert moved > 0


def test_a_large_head_job_reserves_only_nodes_that_could_ever_hold_it():
    # The 8-GPU head job waits for a full 8-GPU node; the 4-GPU node can never hold it, so small jobs use it.
    w = World(BACKFILL, nodes(8, 4))
    w.start_running(job("busy", gpus=6), end=1000)
    w.submit(job("head", gpus=8, t=1), job("small", gpus=2, t=2, runtime=5000))
    reply = w.step()
    assert started(reply) == ["small"] and reply.reservation.job_id == "head"
    assert [s.node for s in reply.started[0].placement.shares] == ["n1"], "on the node the head can never use"
    assert set(reply.reservation.spare) == {"n0"}


def test_running_jobs_without_an_estimate_do_not_block_the_fleet():
    # Two 8-GPU nodes, each partly held by a job with no estimate (the CLI default); the head needs 8.
    w = World(BACKFILL, nodes(8, 8, 4))
    w.start_running(job("a", gpus=6), end=None)  # on n0
    w.start_running(job("b", gpus=3), end=None)  # on n1
    w.submit(job("head", gpus=8, t=1), *[job(f"s{i}", gpus=1, t=2 + i, runtime=36) for i in range(6)])
    reply = w.step()
    # The head holds the one node nearest to holding it (n1, 5 free); the jobs that fit elsewhere start at once.
    assert reply.reservation.spare == {"n1": 0} and reply.reservation.start is None
    assert len(started(reply)) == 6, reply.waiting
    assert all(s.placement.shares[0].node in ("n0", "n2") for s in reply.started)


def test_an_assumed_end_lets_backfill_plan_around_a_job_without_an_estimate():
    w = World(BACKFILL, nodes(8))
    w.start_running(job("old", gpus=4), end=None)
    w.running["old"] = replace(w.running["old"], assumed_end=1000.0)
    w.submit(job("head", gpus=8, t=1), job("short", gpus=2, t=2, runtime=500), job("long", gpus=2, t=3, runtime=5000))
    reply = w.step()
    assert reply.reservation.start == 1000.0 and started(reply) == ["short"]
