"""Random passes for equivalence tests: a random fleet and workload run through `schedule()` pass after pass
(jobs ending, arriving, preempted, moved), each reply's repr, so two variants of the core can be compared."""

from __future__ import annotations

import random
from collections.abc import MutableMapping
from dataclasses import replace

from whaleflux.scheduler.placement import ClusterState, GpuState, Interconnects, JobRequest, ModelFacts, NodeState
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

MODELS = {m: ModelFacts(m, {"llm-train": s, "small": s * 0.8})
          for m, s in (("A100", 1.0), ("H100", 2.6), ("H200", 3.0), ("L4", 0.5))}


def fleet(rng: random.Random) -> list[NodeState]:
    out = []
    for i in range(rng.randint(3, 30)):
        model = rng.choice(list(MODELS))
        mem = 143_771 if model == "H200" else 24_000 if model == "L4" else 81_920
        measured = rng.random() < 0.3  # telemetry: a foreign process may hold memory on its GPUs
        gpus = tuple(GpuState(f"n{i}-g{g}", g, mem, mem * rng.choice([0.2, 1.0]) if measured else None,
                              quarantined=rng.random() < 0.05) for g in range(rng.choice([2, 4, 8])))
        out.append(NodeState(f"n{i}", rng.choice(["c", "c", "d"]), model, rng.choice(["nvlink", "pcie"]), gpus,
                             pool=rng.choice(["a", "b"]), lease_expires_at=rng.choice([None, None, 5_000.0])))
    return out


def job(rng: random.Random, i: int, t: float) -> PendingJob:
    gpus = rng.choice([1, 1, 1, 2, 4, 8, 12])
    req = JobRequest(
        f"j{i}", gpus, min_memory_mib=rng.choice([0, 0, 40 * 1024, 100 * 1024]),
        workload_class=rng.choice(["small", "llm-train"]), team=f"t{rng.randrange(3)}",
        priority=rng.choice(["high", "normal", "low"]), preemptible=rng.random() < 0.5,
        expected_runtime_s=rng.choice([None, rng.uniform(10, 3_000), rng.uniform(10, 300)]),
        allow_multi_node=gpus > 8 or rng.random() < 0.1, pool=rng.choice([None, None, "a"]),
        gpu_models=rng.choice([(), (), (), ("H100", "H200")]),
    )
    return PendingJob(req, t, i, checkpointable=rng.random() < 0.7)


def run_passes(seed: int, running: MutableMapping[str, RunningJob] | None = None, arrivals: int = 25) -> list[str]:
    """Passes over a random fleet and workload (ends, arrivals, preemptions, moves); each reply's repr."""
    rng = random.Random(seed)
    policy = replace(WHALEFLUX, aging_s=rng.choice([None, 200.0]), min_run_before_preemption_s=20.0,
                     migrate_min_gain_s=rng.choice([None, 60.0]), estimates_scale_with_speed=rng.random() < 0.8,
                     spare_largest_memory_while_needed=rng.random() < 0.3,
                     preempt_shorter_max_s=rng.choice([None, None, 1_000.0]),
                     preempt_shorter_every_blocked=rng.random() < 0.5,
                     unmovable_on_largest_max_s=rng.choice([None, 500.0]))
    # Speed counting more the longer a job runs, for every job: short jobs start on slower GPUs, and more of them
    # move up (these states are to exercise every path of a pass, moves included).
    weights = {("speed_by_runtime" if k == "speed" else k): v for k, v in policy.profile.weights.items()}
    policy = replace(policy, profile=replace(policy.profile, weights=weights), pinned_weights={})
    teams = {"t0": TeamPolicy(quota_gpus=4), "t1": TeamPolicy(quota_gpus=2, weight=2.0)} if seed % 2 else {}
    interconnects = rng.choice([Interconnects(), Interconnects(1.0, 0.5, 0.8)])
    cluster, queue = ClusterState(fleet(rng), MODELS, interconnects), PendingQueue(policy)
    running = RunningJobs() if running is None else running
    seq, log = 0, []
    for t in range(0, 600, 30):
        now = float(t)
        for job_id in [j for j, r in running.items() if (r.expected_end or r.assumed_end or 1e9) <= now]:
            del running[job_id]
            cluster.release(job_id)
        for _ in range(rng.randint(0, arrivals)):
            queue.add(job(rng, seq, now))
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
                                           checkpointable=s.job.checkpointable)
    return log
