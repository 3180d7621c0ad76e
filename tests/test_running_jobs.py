"""`RunningJobs`: team usage and the order of ends kept across passes, with the decisions of a plain mapping."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import JobRequest
from whaleflux.scheduler.placement.framework import eligibility
from whaleflux.scheduler.queueing import RunningJob, RunningJobs
from whaleflux.scheduler.queueing.running import end_key, mover_key

from .random_passes import run_passes


def test_usage_and_ends_follow_each_start_change_and_end():
    running = RunningJobs([RunningJob("a", "t1", "normal", False, 2, 0.0, 50.0)])
    running["b"] = RunningJob("b", "t2", "normal", False, 4, 0.0, None, assumed_end=30.0)
    running["c"] = RunningJob("c", "t1", "normal", False, 1, 0.0, None)
    assert running.usage == {"t1": 3, "t2": 4}
    assert [k[2] for k in running.by_end] == ["b", "a", "c"], "by end, the assumed end too, unknown last"
    running["a"] = replace(running["a"], expected_end=10.0, gpus=3)  # moved: a new estimate
    assert running.usage == {"t1": 4, "t2": 4} and running.by_end[0] == (False, 10.0, "a")
    del running["b"]
    assert running.pop("c") is not None and running.pop("c", None) is None
    assert running.usage == {"t1": 3} and running.by_end == [end_key(running["a"])]
    with pytest.raises(KeyError):
        running.pop("c")
    with pytest.raises(ValueError, match="stored as"):
        running["x"] = RunningJob("y", "t1", "normal", False, 1, 0.0)
    with pytest.raises(TypeError, match="one job at a time"):
        running.update({})
    assert dict(running) == {"a": running["a"]}
    copied = copy.deepcopy(running)
    assert copied == running and copied.usage == running.usage and copied.by_end == running.by_end


def test_the_preemptible_jobs_are_kept_as_jobs_start_change_and_end():
    running = RunningJobs([RunningJob("a", "t", "normal", True, 1, 0.0, 50.0),
                           RunningJob("b", "t", "low", False, 1, 0.0)])
    assert list(running.preemptible) == ["a"]
    running["a"] = replace(running["a"], preemptible=False)
    running["b"] = replace(running["b"], preemptible=True)
    assert list(running.preemptible) == ["b"] and running.preemptible["b"] is running["b"]
    del running["b"]
    assert not running.preemptible and copy.deepcopy(running).preemptible == {}


def test_the_groups_of_jobs_that_may_move_are_kept_as_jobs_start_change_and_end():
    def movers(running: RunningJobs) -> dict[object, int]:
        return {key: n for key, (n, _) in running.movers.items()}

    req = JobRequest("a", 2, min_memory_mib=1024.0, workload_class="small")
    running = RunningJobs([RunningJob("a", "t", "normal", False, 2, 0.0, 50.0, request=req, speed=1.0,
                                      checkpointable=True),
                           RunningJob("b", "t", "normal", False, 2, 0.0, 60.0, request=replace(req, job_id="b"),
                                      speed=1.0, checkpointable=True),
                           RunningJob("c", "t", "normal", False, 2, 0.0, 60.0, request=replace(req, job_id="c"),
                                      speed=1.0)])  # no checkpoint: never moves
    group = mover_key(running["a"])
    assert group is not None and mover_key(running["c"]) is None
    assert movers(running) == {group: 2} and eligibility(running.movers[group][1]) == eligibility(req)
    running["a"] = replace(running["a"], speed=2.6)  # moved to a faster model: another group
    faster = mover_key(running["a"])
    assert movers(running) == {group: 1, faster: 1}
    del running["b"]
    running.pop("c")
    assert movers(running) == {faster: 1} and movers(copy.deepcopy(running)) == {faster: 1}
    del running["a"]
    assert running.movers == {}


def test_the_jobs_a_shorter_job_may_stop_are_kept_too_preemptible_or_keeping_a_checkpoint():
    running = RunningJobs([RunningJob("a", "t", "normal", True, 1, 0.0, 50.0),
                           RunningJob("b", "t", "low", False, 1, 0.0, checkpointable=True),
                           RunningJob("c", "t", "low", False, 1, 0.0)])
    assert list(running.stoppable) == ["a", "b"]
    running["b"] = replace(running["b"], checkpointable=False)
    running["c"] = replace(running["c"], checkpointable=True)
    assert sorted(running.stoppable) == ["a", "c"] and running.stoppable["c"] is running["c"]
    del running["a"]
    assert list(running.stoppable) == ["c"] and list(copy.deepcopy(running).stoppable) == ["c"]


def test_decisions_with_running_jobs_are_those_of_a_plain_mapping_over_random_states():
    starts = preempted = moved = 0
    for seed in range(40):
        plain, kept = run_passes(seed, {}, arrivals=6), run_passes(seed, RunningJobs(), arrivals=6)
        assert kept == plain, f"seed {seed}"
        starts += sum(s.count("Started(") for s in plain)
        preempted += sum(s.count("Preemption(") for s in plain)
        moved += sum(s.count("Migration(") for s in plain)
    assert starts > 400 and preempted > 0 and moved > 0, (starts, preempted, moved)
