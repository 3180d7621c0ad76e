"""Shortest remaining first: a short waiting job stops a much longer job that keeps a checkpoint. Pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import ClusterState, GpuState, JobRequest, ModelFacts, NodeState, Placement, place_on
from whaleflux.scheduler.queueing import WHALEFLUX, PendingJob, PendingQueue, RunningJob, RunningJobs, ScheduleRequest
from whaleflux.scheduler.queueing import schedule as run_pass
from whaleflux.scheduler.simulator import ExecutorRules, SimJob, simulate

SRPT = replace(WHALEFLUX, preempt_shorter_max_s=24 * 3600.0, preempt_shorter_ratio=2.0, migrate_min_gain_s=None,
               make_room_by_migration=False)
HOUR = 3600.0


def one_gpu_nodes(n):
    return [NodeState(f"n{i}", "c", "A100", "nvlink", (GpuState(f"n{i}-g0", 0, 81920),)) for i in range(n)]


def waiting(job_id, runtime, priority="normal"):
    return PendingJob(JobRequest(job_id, 1, priority=priority, expected_runtime_s=runtime), 0.0)


def holding(victims, now=HOUR, preemptions=0):
    """A cluster of one-GPU nodes and its running jobs: `victims` (job id -> (left s, checkpointable, priority))
    each hold one GPU since 0, `preemptions` times stopped before."""
    cluster = ClusterState(one_gpu_nodes(len(victims)))
    running = RunningJobs()
    for job_id, (left, checkpointable, priority) in victims.items():
        req = JobRequest(job_id, 1, priority=priority, expected_runtime_s=left)
        d = place_on(cluster, req, SRPT.profile, 0.0)
        assert isinstance(d, Placement)
        cluster.allocate(job_id, d)
        running[job_id] = RunningJob(job_id, "t", priority, False, 1, 0.0, now + left, preemptions=preemptions,
                                     request=req, speed=1.0, checkpointable=checkpointable)
    return cluster, running


def run(policy, victims, job, now=HOUR):
    """One pass: `victims` (as `holding`) each hold one GPU; `job` waits."""
    cluster, running = holding(victims, now)
    queue = PendingQueue(policy)
    queue.add(job)
    return run_pass(ScheduleRequest(now, cluster, queue, running, policy))


def test_a_short_job_stops_a_job_that_keeps_a_checkpoint_and_has_twice_its_runtime_left():
    reply = run(SRPT, {"long": (30 * HOUR, True, "normal")}, waiting("short", 10 * HOUR))
    assert [p.victim for p in reply.preempted] == ["long"]
    assert "30.0 h left, stopped for the shorter job short (10.0 h)" in reply.preempted[0].reason
    assert [s.job.job_id for s in reply.started] == ["short"]


def test_off_without_a_bound_and_never_a_job_without_a_checkpoint_with_less_left_or_of_a_higher_class():
    long = {"long": (30 * HOUR, True, "normal")}
    assert run(replace(SRPT, preempt_shorter_max_s=None), long, waiting("short", HOUR)).preempted == []
    assert run(SRPT, {"pinned": (30 * HOUR, False, "normal")}, waiting("short", HOUR)).preempted == []
    assert run(SRPT, {"near": (19 * HOUR, True, "normal")}, waiting("short", 10 * HOUR)).preempted == []
    assert run(SRPT, {"high": (30 * HOUR, True, "high")}, waiting("short", HOUR)).preempted == []
    assert run(SRPT, long, waiting("day", 25 * HOUR)).preempted == []  # not short: above the bound
    assert [p.victim for p in run(SRPT, {"low": (30 * HOUR, True, "low")}, waiting("short", HOUR)).preempted] == ["low"]


def test_the_guards_hold_a_young_job_or_one_stopped_too_often():
    young = run(SRPT, {"long": (30 * HOUR, True, "normal")}, waiting("short", HOUR), now=300.0)
    assert young.preempted == []  # it ran less than min_run_before_preemption_s
    cluster, running = holding({"long": (30 * HOUR, True, "normal")}, preemptions=SRPT.max_preemptions_per_job)
    queue = PendingQueue(SRPT)
    queue.add(waiting("short", HOUR))
    assert run_pass(ScheduleRequest(HOUR, cluster, queue, running, SRPT)).preempted == []



def gang(job_id, gpus, runtime):
    return PendingJob(JobRequest(job_id, gpus, expected_runtime_s=runtime, allow_multi_node=True), 0.0)


def test_a_short_gang_stops_longer_jobs_on_several_nodes_and_starts_across_them():
    victims = {"long1": (30 * HOUR, True, "normal"), "long2": (40 * HOUR, True, "normal"),
               "pinned": (30 * HOUR, False, "normal")}
    reply = run(SRPT, victims, gang("gang", 2, HOUR))
    assert sorted(p.victim for p in reply.preempted) == ["long1", "long2"]
    assert [s.job.job_id for s in reply.started] == ["gang"] and reply.started[0].placement.gpu_count == 2
    # All or nothing: three GPUs would need the job without a checkpoint too, so nothing is stopped.
    assert run(SRPT, victims, gang("gang", 3, HOUR)).preempted == []


@pytest.mark.parametrize("split", ["cluster", "model"])
def test_a_gang_stops_jobs_only_on_nodes_of_one_model_within_one_cluster_and_pool(split):
    # Two clusters (or models) of two one-GPU nodes, each with a long job that keeps a checkpoint and one that does
    # not: the two stoppable jobs would make room for the gang only across clusters (or models).
    halves = ("c0", "c1") if split == "cluster" else ("A100", "H100")
    nodes = [replace(n, **{split: halves[i // 2]}) for i, n in enumerate(one_gpu_nodes(4))]
    cluster, running = ClusterState(nodes), RunningJobs()
    for i, node in enumerate(nodes):
        job_id = f"{node.name}-{'long' if i % 2 == 0 else 'pinned'}"
        req = JobRequest(job_id, 1, expected_runtime_s=30 * HOUR)
        d = place_on(ClusterState([node]), req, SRPT.profile, 0.0)
        assert isinstance(d, Placement)
        cluster.allocate(job_id, d)
        running[job_id] = RunningJob(job_id, "t", "normal", False, 1, 0.0, HOUR + 30 * HOUR, request=req,
                                     speed=1.0, checkpointable=i % 2 == 0)
    queue = PendingQueue(SRPT)
    queue.add(gang("gang", 2, HOUR))
    reply = run_pass(ScheduleRequest(HOUR, cluster, queue, running, SRPT))
    assert reply.preempted == [] and reply.started == [] and "gang" in reply.waiting

@pytest.mark.parametrize("every", [False, True])
def test_only_the_first_blocked_job_stops_a_longer_one_unless_every_blocked_job_may(every):
    victims = {"long1": (30 * HOUR, True, "normal"), "long2": (30 * HOUR, True, "normal")}
    cluster, running = holding(victims)
    policy = replace(SRPT, preempt_shorter_every_blocked=every)
    queue = PendingQueue(policy)
    queue.add(PendingJob(JobRequest("first", 1, expected_runtime_s=HOUR), 0.0, seq=1))
    queue.add(PendingJob(JobRequest("second", 1, expected_runtime_s=HOUR), 0.0, seq=2))
    reply = run_pass(ScheduleRequest(HOUR, cluster, queue, running, policy))
    assert sorted(s.job.job_id for s in reply.started) == (["first", "second"] if every else ["first"])
    assert sorted(p.victim for p in reply.preempted) == (["long1", "long2"] if every else ["long1"])


@pytest.mark.parametrize(("searches", "started"), [(None, 4), (2, 3), (0, 1)])
def test_later_blocked_jobs_search_for_victims_at_most_max_preemption_searches_times_a_pass(searches, started):
    victims = {f"long{i}": (30 * HOUR, True, "normal") for i in range(4)}
    cluster, running = holding(victims)
    policy = replace(SRPT, preempt_shorter_every_blocked=True, max_preemption_searches=searches)
    queue = PendingQueue(policy)
    for i in range(4):  # the head's search is not counted
        queue.add(PendingJob(JobRequest(f"short{i}", 1, expected_runtime_s=HOUR), 0.0, seq=i))
    reply = run_pass(ScheduleRequest(HOUR, cluster, queue, running, policy))
    assert [s.job.job_id for s in reply.started] == [f"short{i}" for i in range(started)]
    assert len(reply.preempted) == started


FACTS = {"A100": ModelFacts("A100", {"llm-train": 1.0})}


def test_a_stopped_job_resumes_with_the_estimate_it_has_left():
    # "long" (llm-train: keeps a checkpoint, 10,000 s) runs from 0; "short" (1,000 s) stops it at 1,000 s and
    # runs to 2,000 s; "long" resumes then. "mid" (4,300 s) arrives at 3,000 s: "long" has 8,000 s left by
    # its remaining estimate (9,000 s from 2,000 s), less than twice 4,300; by its full estimate 9,000 s.
    jobs = [SimJob("long", 0, 10_000, 1, "t", "llm-train", 10, "normal", False),
            SimJob("short", 1000, 1000, 1, "t", "llm-train", 10, "normal", False),
            SimJob("mid", 3000, 4300, 1, "t", "llm-train", 10, "normal", False)]
    policy = replace(SRPT, min_run_before_preemption_s=0.0)

    def outcomes(remaining):
        rules = ExecutorRules(stop_s=0.0, resume_s=0.0, remaining_estimate_after_preemption=remaining)
        return {o.job_id: o for o in simulate(jobs, one_gpu_nodes(1), policy, FACTS, rules=rules).outcomes}

    kept = outcomes(True)
    assert kept["long"].preemptions == 1 and kept["long"].finish_s == pytest.approx(11_000.0)
    assert kept["mid"].first_start_s == pytest.approx(11_000.0)
    full = outcomes(False)
    assert full["long"].preemptions == 2 and full["mid"].first_start_s == 3000.0



EVERY = replace(SRPT, preempt_shorter_every_blocked=True)


def test_a_later_short_job_never_stops_a_job_on_a_node_a_reservation_counts_on():
    # Two nodes of three GPUs. n0: one GPU free, a long checkpointing job (30 h left), one without a checkpoint
    # ending in half an hour; n1: two long checkpointing jobs and one without a checkpoint (10 h left). "big"
    # (two GPUs, 25 h: above the bound) blocks first and reserves n0; "short" (two GPUs, 1 h) then stops the
    # two long jobs of n1, not the one of n0 (which costs less and which it would stop without a reservation).
    def one_pass(policy, *jobs):
        nodes = [NodeState(f"n{i}", "c", "A100", "nvlink",
                           tuple(GpuState(f"n{i}-g{g}", g, 81920) for g in range(3))) for i in range(2)]
        cluster, running = ClusterState(nodes), RunningJobs()
        for job_id, node, left, checkpointable in (("long0", "n0", 30, True), ("pinned0", "n0", 0.5, False),
                                                   ("long1a", "n1", 30, True), ("long1b", "n1", 30, True),
                                                   ("pinned1", "n1", 10, False)):
            req = JobRequest(job_id, 1, expected_runtime_s=left * HOUR)
            d = place_on(cluster, req, policy.profile, 0.0, caps={"n1" if node == "n0" else "n0": 0})
            assert isinstance(d, Placement) and d.node == node
            cluster.allocate(job_id, d)
            running[job_id] = RunningJob(job_id, "t", "normal", False, 1, 0.0, HOUR + left * HOUR, request=req,
                                         speed=1.0, checkpointable=checkpointable)
        queue = PendingQueue(policy)
        for seq, (job_id, gpus, runtime) in enumerate(jobs):
            queue.add(PendingJob(JobRequest(job_id, gpus, expected_runtime_s=runtime), 0.0, seq=seq))
        return run_pass(ScheduleRequest(HOUR, cluster, queue, running, policy))

    reply = one_pass(EVERY, ("big", 2, 25 * HOUR), ("short", 2, HOUR))
    assert reply.reservation is not None and reply.reservation.job_id == "big"
    assert reply.reservation.describe().count("n0") >= 1
    assert sorted(p.victim for p in reply.preempted) == ["long1a", "long1b"]
    assert [(s.job.job_id, s.placement.node) for s in reply.started] == [("short", "n1")]
    # Alone (as the first blocked job: no reservation yet) it stops the one long job of n0.
    assert [p.victim for p in one_pass(EVERY, ("short", 2, HOUR)).preempted] == ["long0"]
