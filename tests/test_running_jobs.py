"""`RunningJobs`: team usage and the order of ends kept across passes, with the decisions of a plain mapping."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import ClusterState, GpuState, JobRequest, ModelFacts, NodeState
from whaleflux.scheduler.queueing import (
    WHALEFLUX,
    PendingJob,
    PendingQueue,
    RunningJob,
    RunningJobs,
    ScheduleRequest,
    TeamPolicy,
    schedule,
)
from whaleflux.scheduler.queueing.running import end_key


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


MODELS = {m: ModelFacts(m, {"llm-train": s, "small": s}) for m, s in (("A100", 1.0), ("H100", 2.6), ("H200", 3.0))}


def _fleet(rng: random.Random) -> list[NodeState]:
    out = []
    for i in range(rng.randint(3, 10)):
        model = rng.choice(list(MODELS))
        size = rng.choice([2, 4, 8])
        mem = 143_771 if model == "H200" else 81_920
        measured = rng.random() < 0.3  # telemetry: a foreign process may hold memory on its GPUs
        gpus = tuple(GpuState(f"n{i}-g{g}", g, mem, mem * rng.choice([0.2, 1.0]) if measured else None,
                              quarantined=rng.random() < 0.05) for g in range(size))
        out.append(NodeState(f"n{i}", "c", model, "nvlink", gpus, pool=rng.choice(["a", "b"]),
                             lease_expires_at=rng.choice([None, None, 5_000.0])))
    return out


def _job(rng: random.Random, i: int, t: float) -> PendingJob:
    gpus = rng.choice([1, 1, 2, 4, 8, 12])
    req = JobRequest(
        f"j{i}", gpus, min_memory_mib=rng.choice([0, 0, 40 * 1024, 100 * 1024]),
        workload_class=rng.choice(["small", "llm-train"]),
        team=f"t{rng.randrange(3)}", priority=rng.choice(["high", "normal", "low"]), preemptible=rng.random() < 0.5,
        expected_runtime_s=rng.choice([None, rng.uniform(10, 3_000)]), allow_multi_node=gpus > 8,
        pool=rng.choice([None, None, "a"]),
    )
    return PendingJob(req, t, i)


def _run(seed: int, running: dict[str, RunningJob]) -> list[str]:
    """Passes over a random fleet and workload (jobs ending, arriving, preempted, moved); each reply's repr."""
    rng = random.Random(seed)
    policy = replace(WHALEFLUX, aging_s=rng.choice([None, 200.0]), min_run_before_preemption_s=20.0,
                     migrate_min_gain_s=rng.choice([None, 60.0]))
    teams = {"t0": TeamPolicy(quota_gpus=4), "t1": TeamPolicy(quota_gpus=2, weight=2.0)} if seed % 2 else {}
    cluster, queue = ClusterState(_fleet(rng), MODELS), PendingQueue(policy)
    seq, log = 0, []
    for t in range(0, 600, 30):
        now = float(t)
        for job_id in [j for j, r in running.items() if (r.expected_end or r.assumed_end or 1e9) <= now]:
            del running[job_id]
            cluster.release(job_id)
        for _ in range(rng.randint(0, 6)):
            queue.add(_job(rng, seq, now))
            seq += 1
        reply = schedule(ScheduleRequest(now, cluster, queue, running, policy, teams))
        log.append(repr(reply))
        for p in reply.preempted:
            running.pop(p.victim, None)
        for m in reply.migrated:
            running[m.job_id] = replace(running[m.job_id], expected_end=m.expected_end, speed=m.placement.speed,
                                        migrations=running[m.job_id].migrations + 1)
        for s in reply.started:
            r = s.job.request
            assumed = now + 400.0 if s.expected_end is None and rng.random() < 0.5 else None
            running[r.job_id] = RunningJob(r.job_id, r.team, r.priority, r.preemptible, r.gpus, now, s.expected_end,
                                           assumed_end=assumed, request=r, speed=s.placement.speed,
                                           checkpointable=rng.random() < 0.7)
    return log


def test_decisions_with_running_jobs_are_those_of_a_plain_mapping_over_random_states():
    starts = preempted = moved = 0
    for seed in range(40):
        plain, kept = _run(seed, {}), _run(seed, RunningJobs())
        assert kept == plain, f"seed {seed}"
        starts += sum(s.count("Started(") for s in plain)
        preempted += sum(s.count("Preemption(") for s in plain)
        moved += sum(s.count("Migration(") for s in plain)
    assert starts > 400 and preempted > 0 and moved > 0, (starts, preempted, moved)
