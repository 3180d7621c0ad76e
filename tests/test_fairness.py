"""Fairness mechanics of the queue core: aging bounds waits; the largest-memory GPUs stay for jobs that need them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import ClusterState, GpuState, JobRequest, ModelFacts, NodeState, Placement, place_on
from whaleflux.scheduler.queueing import WHALEFLUX, PendingJob, PendingQueue, RunningJob, ScheduleRequest, schedule

POLICY = replace(WHALEFLUX, preemption=False, aging_s=3600.0)
MODELS = {
    "A100": ModelFacts("A100", {"llm-train": 1.0, "small": 1.0}),
    "H100": ModelFacts("H100", {"llm-train": 2.6, "small": 1.5}),
    "H200": ModelFacts("H200", {"llm-train": 3.0, "small": 1.5}),
}


def nodes(*specs):
    """(name, model, GPUs, GB per GPU) -> nodes."""
    return [
        NodeState(name, "c", model, "nvlink", tuple(GpuState(f"{name}-g{g}", g, gb * 1024) for g in range(n)))
        for name, model, n, gb in specs
    ]


def pending(job_id, t, gpus=1, priority="normal", team="t", runtime=600.0, gb=0, klass="small"):
    req = JobRequest(job_id, gpus, team=team, priority=priority, expected_runtime_s=runtime,
                     min_memory_mib=gb * 1024, workload_class=klass)
    return PendingJob(req, t)


def run_on(cluster, running, job_id, node, now, end, gpus=1, klass="llm-train", gb=0):
    """A movable job running on `node` since `now`, expected to end at `end`."""
    req = JobRequest(job_id, gpus, workload_class=klass, expected_runtime_s=end - now, min_memory_mib=gb * 1024,
                     gpu_models=(cluster.nodes[node].model,))
    d = place_on(cluster, req, POLICY.profile, now, caps={n: 0 for n in cluster.nodes if n != node})
    assert isinstance(d, Placement)
    cluster.allocate(job_id, d)
    running[job_id] = RunningJob(job_id, "t", "normal", False, gpus, now, end, request=replace(req, gpu_models=()),
                                 speed=d.speed, checkpointable=True)


def test_a_job_waiting_past_the_aging_bound_comes_before_higher_priority_and_other_teams():
    q = PendingQueue(POLICY)
    q.add(pending("old-low", 0.0, priority="low", team="busy"))
    q.add(pending("young-high", 5000.0, priority="high"))
    q.add(pending("young-normal", 5000.0, team="idle"))
    q.add(pending("older-normal", 100.0, team="busy"))
    usage = {"busy": 100}
    order = ["young-high", "young-normal", "older-normal", "old-low"]
    assert [j.job_id for j in q.ordered(usage, {}, now=3000.0)] == order
    # Past the bound (3,600 s) the two old ones come first, oldest first, whatever their class and team.
    order = ["old-low", "older-normal", "young-high", "young-normal"]
    assert [j.job_id for j in q.ordered(usage, {}, now=5000.0)] == order
    # Without a bound, or without `now`, the order is the classes' order.
    assert [j.job_id for j in q.ordered(usage, {})][0] == "young-high"
    plain = PendingQueue(replace(POLICY, aging_s=None))
    for j in ("old-low", "young-high"):
        plain.add(pending(j, 0.0 if j == "old-low" else 5000.0, priority=j.split("-")[1]))
    assert [j.job_id for j in plain.ordered({}, {}, now=1e9)] == ["young-high", "old-low"]


@pytest.mark.parametrize("shortest_first", [False, True])
def test_among_aged_jobs_those_never_preempted_come_before_preempted_ones(shortest_first):
    q = PendingQueue(replace(POLICY, shortest_first=shortest_first))
    q.add(replace(pending("stopped-twice", 0.0, team="a"), preemptions=2))
    q.add(replace(pending("stopped-once", 50.0, priority="high", team="b"), preemptions=1))
    q.add(pending("never-ran", 100.0, priority="low", team="c"))
    q.add(pending("never-ran-later", 200.0, team="a"))
    q.add(pending("young", 4000.0, priority="high"))
    # Past the bound the jobs that never ran come first (oldest first, whatever their class), then the preempted
    # ones (oldest first), then the young ones.
    order = ["never-ran", "never-ran-later", "stopped-twice", "stopped-once", "young"]
    assert [j.job_id for j in q.ordered({}, {}, now=4000.0)] == order
    # Below the bound, a preempted job keeps its place by its submission in its class.
    assert [j.job_id for j in q.ordered({}, {}, now=3000.0)][:2] == ["stopped-once", "young"]


def test_an_aged_blocked_job_holds_the_reservation_so_a_stream_of_high_priority_jobs_cannot_pass_it():
    cluster = ClusterState(nodes(("n", "A100", 2, 80)), MODELS)
    running: dict[str, RunningJob] = {}
    run_on(cluster, running, "holder", "n", 0.0, 1000.0, klass="small")
    q = PendingQueue(POLICY)
    q.add(pending("wide", 0.0, gpus=2, runtime=600.0))
    q.add(pending("urgent", 100.0, priority="high", runtime=5000.0))
    # Young: the high-priority job goes first and takes the free GPU; "wide" is pushed back.
    reply = schedule(ScheduleRequest(200.0, cluster, q, running, POLICY))
    assert [s.job.job_id for s in reply.started] == ["urgent"]
    cluster.release("urgent")
    q.add(pending("urgent", 100.0, priority="high", runtime=5000.0))
    # Aged (waited 4,000 s > 3,600 s): "wide" is the head; its reservation (at 1,000 s, when the holder
    # ends) keeps the 5,000 s high-priority job off the free GPU.
    reply = schedule(ScheduleRequest(4000.0, cluster, q, running, POLICY))
    assert reply.started == [] and reply.reservation is not None and reply.reservation.job_id == "wide"
    assert "would delay wide" in reply.waiting["urgent"]


def test_moves_up_keep_a_job_that_fits_smaller_gpus_off_the_largest_memory_model():
    fleet = nodes(("a", "A100", 1, 80), ("x", "H200", 1, 141))
    for spare, expected in ((False, ["long"]), (True, [])):
        cluster, running = ClusterState(fleet, MODELS), dict[str, RunningJob]()
        run_on(cluster, running, "long", "a", 0.0, 7 * 86400.0)
        policy = replace(POLICY, migrate_spares_largest_memory=spare)
        reply = schedule(ScheduleRequest(100.0, cluster, PendingQueue(policy), running, policy))
        assert [m.job_id for m in reply.migrated] == expected


def test_making_room_moves_a_job_to_a_smaller_memory_gpu_rather_than_onto_another_largest_memory_one():
    # A 2-GPU job needing 100 GB can only use an H200 node. The job in its way fits 80 GB: it goes to
    # the A100, not to the other H200 node's free GPU (faster, but the next such job needs it).
    fleet = nodes(("a", "A100", 1, 80), ("x1", "H200", 2, 141), ("x2", "H200", 2, 141))
    for spare, target in ((True, "a"), (False, "x2")):
        policy = replace(POLICY, make_room_budget=100.0, migrate_spares_largest_memory=spare)
        cluster, running = ClusterState(fleet, MODELS), dict[str, RunningJob]()
        run_on(cluster, running, "fits-80", "x1", 0.0, 86400.0)
        run_on(cluster, running, "other-big", "x2", 0.0, 86400.0, gb=100)
        q = PendingQueue(policy)
        q.add(pending("needs-100", 0.0, gpus=2, gb=100, runtime=3600.0, klass="llm-train"))
        reply = schedule(ScheduleRequest(1000.0, cluster, q, running, policy))
        (m,) = reply.migrated
        assert (m.job_id, m.placement.node) == ("fits-80", target)
        assert [(s.job.job_id, s.placement.node) for s in reply.started] == [("needs-100", "x1")]


def test_a_second_aged_job_gets_a_reservation_of_its_own_on_other_nodes():
    # Two 2-GPU nodes, one GPU of each held (until 5,000 s on n1, 6,000 s on n2). Two 2-GPU jobs have
    # waited past the bound: the older reserves n1, the other n2, so a young 1-GPU job that would run
    # past 6,000 s may take neither free GPU.
    cluster = ClusterState(nodes(("n1", "A100", 2, 80), ("n2", "A100", 2, 80)), MODELS)
    running: dict[str, RunningJob] = {}
    run_on(cluster, running, "h1", "n1", 0.0, 5000.0, klass="small")
    run_on(cluster, running, "h2", "n2", 0.0, 6000.0, klass="small")
    policy = replace(POLICY, make_room_by_migration=False, migrate_min_gain_s=None)
    q = PendingQueue(policy)
    q.add(pending("old", 0.0, gpus=2))
    q.add(pending("older-than-bound", 100.0, gpus=2))
    q.add(pending("young", 3900.0, runtime=9000.0))
    reply = schedule(ScheduleRequest(4000.0, cluster, q, running, policy))
    assert reply.started == []
    assert reply.reservation is not None and (reply.reservation.job_id, reply.reservation.start) == ("old", 5000.0)
    assert "aging bound" in reply.waiting["older-than-bound"] and "n2" in reply.waiting["older-than-bound"]
    assert "would delay" in reply.waiting["young"]
    # Without aging only the head reserves: the young job takes n2's free GPU and delays the other one.
    plain = replace(policy, aging_s=None)
    cluster.release("young")
    q = PendingQueue(plain)
    for j in (pending("old", 0.0, gpus=2), pending("older-than-bound", 100.0, gpus=2),
              pending("young", 3900.0, runtime=9000.0)):
        q.add(j)
    reply = schedule(ScheduleRequest(4000.0, cluster, q, running, plain))
    assert [(s.job.job_id, s.placement.node) for s in reply.started] == [("young", "n2")]


def test_while_a_job_that_needs_the_largest_memory_waits_smaller_jobs_keep_off_those_gpus():
    # The A100 is busy; one H200 GPU is free, the other held until 10,000 s. "needs-100" (2 GPUs > 80 GB)
    # waits for the H200 node; "fits-80" would fit the free H200 GPU (and end before 10,000 s).
    fleet = nodes(("a", "A100", 1, 80), ("x", "H200", 2, 141))
    policy = replace(POLICY, make_room_by_migration=False, migrate_min_gain_s=None)

    def pass_at(now, spare=True):
        p = replace(policy, spare_largest_memory_while_needed=spare)
        cluster, running = ClusterState(fleet, MODELS), dict[str, RunningJob]()
        run_on(cluster, running, "busy-a", "a", 0.0, 50_000.0, klass="small")
        run_on(cluster, running, "busy-x", "x", 0.0, 10_000.0, klass="small", gb=100)
        q = PendingQueue(p)
        q.add(pending("needs-100", 0.0, gpus=2, gb=100, runtime=3600.0))
        q.add(pending("fits-80", 10.0, runtime=100.0))
        return schedule(ScheduleRequest(now, cluster, q, running, p))

    kept = pass_at(100.0)
    assert kept.started == [] and "A100" in kept.waiting["fits-80"]
    assert [s.job.job_id for s in pass_at(100.0, spare=False).started] == ["fits-80"]
    # Past the aging bound (3,600 s) it takes what is free, like any aged job.
    assert [s.job.job_id for s in pass_at(3700.0).started] == ["fits-80"]


def test_aging_bounds_the_wait_of_a_long_job_when_the_shortest_go_first():
    policy = replace(POLICY, shortest_first=True)
    q = PendingQueue(policy)
    q.add(pending("long-old", 0.0, runtime=50_000.0))
    q.add(pending("short-young", 5000.0, runtime=60.0))
    q.add(pending("mid-young", 4000.0, runtime=600.0))
    q.add(pending("long-older", 0.0, runtime=90_000.0, team="u"))
    before = [j.job_id for j in q.ordered({}, {}, now=3000.0)]  # none aged: least work first in each team
    assert before.index("short-young") < before.index("mid-young") < before.index("long-old")
    # Past the bound the two old long jobs come first (oldest first), then the rest by work.
    after = [j.job_id for j in q.ordered({}, {}, now=5000.0)]
    assert after[:2] == ["long-old", "long-older"] and after[2:] == ["short-young", "mid-young"]


def test_a_long_job_that_fits_80_gb_takes_a_free_h100_rather_than_an_h200_even_where_the_h200_is_much_faster():
    # Inference runs 2.3x on an H200 and 1.6x on an H100: speed alone would pick the H200, where a
    # week-long job that never checkpoints would sit in the way of every job above 80 GB.
    facts = {"H100": ModelFacts("H100", {"inference": 1.6}), "H200": ModelFacts("H200", {"inference": 2.3})}
    cluster = ClusterState(nodes(("h", "H100", 1, 80), ("x", "H200", 1, 141)), facts)
    week = JobRequest("serve", 1, workload_class="inference", min_memory_mib=70 * 1024, expected_runtime_s=7 * 86400.0)
    d = place_on(cluster, week, POLICY.profile, 0.0)
    assert isinstance(d, Placement) and d.node == "h"
    needs = replace(week, min_memory_mib=100 * 1024)
    d = place_on(cluster, needs, POLICY.profile, 0.0)
    assert isinstance(d, Placement) and d.node == "x"


@pytest.mark.parametrize(("checkpointable", "model"), [(False, "H200"), (True, "H100")])
def test_a_short_job_that_keeps_no_checkpoint_takes_a_free_h200_where_its_class_runs_much_faster(checkpointable, model):
    # Inference runs 1.44x as fast on an H200 as on an H100. A two-hour inference job that keeps no checkpoint keeps
    # its first GPU to the end, so speed counts more (weight 10): it takes the free H200 (and leaves it within the
    # unmovable bound). One that keeps a checkpoint leaves the H200 to the jobs only it can hold.
    facts = {"H100": ModelFacts("H100", {"inference": 1.6}), "H200": ModelFacts("H200", {"inference": 2.3})}
    cluster = ClusterState(nodes(("h", "H100", 1, 80), ("x", "H200", 1, 141)), facts)
    queue = PendingQueue(POLICY)
    queue.add(replace(pending("j", 0.0, runtime=2 * 3600.0, gb=40, klass="inference"), checkpointable=checkpointable))
    reply = schedule(ScheduleRequest(0.0, cluster, queue, {}, POLICY))
    assert [(s.job.job_id, s.placement.model) for s in reply.started] == [("j", model)]


@pytest.mark.parametrize(("job", "now", "limit", "placed"), [
    ("long-unmovable", 100.0, 4 * 3600.0, None),  # kept off the H200: no move could take it off again
    ("long-unmovable", 100.0, None, "x"),  # the rule off: it takes the free H200
    ("long-unmovable", 3700.0, 4 * 3600.0, "x"),  # past the aging bound (3,600 s) it takes what is free
    ("long-checkpointing", 100.0, 4 * 3600.0, "x"),  # a move can take it off once a job needs the H200
    ("short-unmovable", 100.0, 4 * 3600.0, "x"),  # it leaves the H200 within the bound
    ("long-gang", 100.0, 4 * 3600.0, None),  # over two nodes (one H200): a gang is never moved, checkpoint or not
    ("long-gang", 100.0, None, "x"),
])
def test_a_long_job_that_could_not_be_moved_keeps_off_the_largest_memory_model(job, now, limit, placed):
    # A100 node "a" is busy, and "b" too unless the job is the two-GPU gang; the H200 node is free. Each job fits
    # 80 GB.
    fleet = nodes(("a", "A100", 1, 80), ("b", "A100", 1, 80), ("x", "H200", 1, 141))
    policy = replace(POLICY, make_room_by_migration=False, migrate_min_gain_s=None, unmovable_on_largest_max_s=limit)
    cluster, running = ClusterState(fleet, MODELS), dict[str, RunningJob]()
    run_on(cluster, running, "busy-a", "a", 0.0, 50_000.0, klass="small")
    if not job.endswith("gang"):
        run_on(cluster, running, "busy-b", "b", 0.0, 50_000.0, klass="small")
    q = PendingQueue(policy)
    runtime = 600.0 if job.startswith("short") else 86_400.0
    p = replace(pending(job, 0.0, gpus=2 if job.endswith("gang") else 1, runtime=runtime, gb=40),
                checkpointable=job.endswith(("checkpointing", "gang")))  # the gang keeps one too
    if p.request.gpus > 1:
        p = replace(p, request=replace(p.request, allow_multi_node=True))
    q.add(p)
    reply = schedule(ScheduleRequest(now, cluster, q, running, policy))
    assert [(s.job.job_id, "x" in [p.node for p in s.placement.shares]) for s in reply.started] == (
        [(job, True)] if placed else [])
    if placed is None:
        assert "A100" in reply.waiting[job]


@pytest.mark.parametrize(("checkpointable", "model"), [(True, "RTX4090"), (False, "H100")])
def test_a_job_that_keeps_no_checkpoint_is_placed_by_speed_for_no_move_could_speed_it_up_later(checkpointable, model):
    # A one-GPU small job fits every model. The last free GPU of the 4090 node fits best, and a 4090 runs small jobs
    # 0.9x against the other classes' 0.45-0.6x (comparative advantage): a job that keeps a checkpoint takes it and
    # may move up later. One that keeps none takes the fastest, an H100.
    facts = {**MODELS, "RTX4090": ModelFacts("RTX4090", {"llm-train": 0.45, "small": 0.9})}
    cluster = ClusterState(nodes(("r", "RTX4090", 1, 24), ("a", "A100", 8, 80), ("h", "H100", 8, 80)), facts)
    queue = PendingQueue(POLICY)
    queue.add(replace(pending("j", 0.0, runtime=4 * 3600.0, gb=5), checkpointable=checkpointable))
    reply = schedule(ScheduleRequest(0.0, cluster, queue, {}, POLICY))
    assert [(s.job.job_id, s.placement.model) for s in reply.started] == [("j", model)]
