"""Score plugins: how good is this candidate node for this job? Each returns 0..100.

The framework combines them with weights from the profile, so a policy is a
configuration of plugins, not a fork of the scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .cluster import ClusterState
from .model import JobRequest, NodeState


@dataclass(frozen=True)
class Candidate:
    node: NodeState
    gpus: tuple[int, ...]
    leftover: int  # usable GPUs the node still has after this job
    speed: float  # class speed on the model x interconnect efficiency


@dataclass(frozen=True)
class ScoreContext:
    cluster: ClusterState
    best_speed: float  # fastest candidate's speed, for normalizing
    best_work_per_usd: float | None
    best_advantage: float = 0.0  # best comparative advantage among candidates
    smallest_memory_mib: float = 1.0  # smallest GPU memory among candidates
    # Largest GPU memory among candidates, and the largest below it (equal when all are alike).
    largest_memory_mib: float = 1.0
    runner_up_memory_mib: float = 1.0
    # The fleet's largest GPU memory (free or not): only candidates of that tier are its largest-memory GPUs.
    fleet_largest_memory_mib: float = 1.0


# Memory sizes within 5 % of each other are one tier (an A100's 81,920 MiB and an H100's 81,559 MiB).
SAME_TIER = 0.95


LONG_JOB_S = 48 * 3600.0  # from this runtime on, speed counts fully

Scorer = Callable[[JobRequest, Candidate, ScoreContext], float]


def best_fit(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Least fragmentation: prefer the node left with the fewest free GPUs."""
    return 100.0 * (1.0 - cand.leftover / max(1, len(cand.node.gpus)))


def speed(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """The job's class runs faster on this model (gpu_models.yaml `speed`)."""
    return 100.0 * cand.speed / ctx.best_speed if ctx.best_speed > 0 else 100.0


def speed_by_runtime(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Speed matters in proportion to how long the job runs: a day-long job wants the
    fastest GPU, a five-minute job hardly gains from one (unknown runtime: like `speed`)."""
    ratio = cand.speed / ctx.best_speed if ctx.best_speed > 0 else 1.0
    if req.expected_runtime_s is None:
        return 100.0 * ratio
    weight = min(1.0, math.log1p(req.expected_runtime_s / 600.0) / math.log1p(LONG_JOB_S / 600.0))
    return 100.0 * (weight * ratio + (1.0 - weight))


def comparative_advantage(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Give each model to the classes it speeds up most relative to other classes.

    A small job runs 1.5x on an H100 but an LLM training job 2.6x: an H100
    given to the small job is worth less than to the training job, and an
    RTX 4090 (0.9x for small jobs) serves the small job almost as well.
    """
    facts = ctx.cluster.facts.get(cand.node.model)
    if facts is None or not facts.speed:
        return 100.0
    mean = facts.speed_total / len(facts.speed)
    if not ctx.best_advantage:
        return 100.0
    return min(100.0, 100.0 * facts.speed_for(req.workload_class) / mean / ctx.best_advantage)


def memory_right_size(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Keep large-memory GPUs for jobs that need the memory."""
    return 100.0 * ctx.smallest_memory_mib / ctx.cluster.memory[cand.node.name]


def spare_largest_memory(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Keep the largest-memory GPUs for jobs that only they can hold.

    Unlike `memory_right_size` this leaves the choice among the other models to
    speed: a job that fits in 80 GB avoids a 141 GB H200 (needed by the jobs
    above 80 GB, which nothing else can run) but is not pushed from an H100 to
    a 24 GB card. A job that needs the largest memory has no smaller candidate,
    so it is never penalized. Only the fleet's largest tier is spared: when those GPUs are all taken, an H100
    is the largest candidate but not a GPU only the largest jobs can use, so it is scored like any other.
    """
    mem = ctx.cluster.memory[cand.node.name]
    if (mem < ctx.largest_memory_mib or ctx.runner_up_memory_mib >= ctx.largest_memory_mib
            or mem < SAME_TIER * ctx.fleet_largest_memory_mib):
        return 100.0
    return 100.0 * ctx.runner_up_memory_mib / ctx.largest_memory_mib


def cost(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Work done per dollar on this model; neutral when prices are unknown."""
    facts = ctx.cluster.facts.get(cand.node.model)
    if not ctx.best_work_per_usd or facts is None or not facts.usd_per_gpu_hour:
        return 50.0
    return 100.0 * (cand.speed / float(facts.usd_per_gpu_hour)) / ctx.best_work_per_usd


def nvlink_locality(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """A multi-GPU job wants its GPUs joined by NVLink."""
    if req.gpus <= 1:
        return 100.0
    return 100.0 * ctx.cluster.interconnects.for_node(cand.node.interconnect)


def spread_replicas(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Replicas of one inference service go to different nodes."""
    if not req.service:
        return 100.0
    return 100.0 / (1 + ctx.cluster.services_on[cand.node.name][req.service])


def first_fit(req: JobRequest, cand: Candidate, ctx: ScoreContext) -> float:
    """Earliest node in fleet order (the model-unaware baselines)."""
    return 100.0 * (1.0 - ctx.cluster.order[cand.node.name] / max(1, len(ctx.cluster.order)))


SCORERS: dict[str, Scorer] = {
    "best_fit": best_fit,
    "speed": speed,
    "speed_by_runtime": speed_by_runtime,
    "cost": cost,
    "comparative_advantage": comparative_advantage,
    "memory_right_size": memory_right_size,
    "spare_largest_memory": spare_largest_memory,
    "nvlink_locality": nvlink_locality,
    "spread_replicas": spread_replicas,
    "first_fit": first_fit,
}


def candidate_speed(cluster: ClusterState, req: JobRequest, node: NodeState) -> float:
    """Relative speed of the job on `req.gpus` GPUs of this one node."""
    s = cluster.speed(node.model, req.workload_class)
    return s if req.gpus <= 1 else s * cluster.interconnects.for_node(node.interconnect)


def advantage(cluster: ClusterState, req: JobRequest, node: NodeState) -> float:
    """The class's speed on the node's model over that model's mean speed across classes."""
    facts = cluster.facts.get(node.model)
    if facts is None or not facts.speed:
        return 1.0
    return facts.speed_for(req.workload_class) * len(facts.speed) / facts.speed_total


def work_per_usd(cluster: ClusterState, cand: Candidate) -> float | None:
    """Speed per dollar-hour of one GPU, or None without a price."""
    facts = cluster.facts.get(cand.node.model)
    if facts is None or not facts.usd_per_gpu_hour:
        return None
    return cand.speed / float(facts.usd_per_gpu_hour)
