"""Wait for a faster GPU model: only when waiting clearly finishes the job sooner.

Mean completion time is dominated by the longest jobs, and a week-long job
that starts on an A100 because the H100s are busy for another hour finishes
days later than if it had waited that hour. A job whose best free placement is
on a slower model waits when, by the running jobs' estimates, GPUs of a faster
model free up early enough that start + runtime there beats running now by
the configured margin. Short jobs never gain enough, so they take the slower
GPU at once (a slower GPU that fits is used rather than left idle). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..placement import ClusterState, Placement
from ..placement.framework import eligible
from ..placement.scorers import candidate_speed
from .jobs import PendingJob, PolicyConfig, RunningJob
from .reservation import reserve


def faster_start(
    cluster: ClusterState,
    job: PendingJob,
    placement: Placement,
    running: Mapping[str, RunningJob],
    config: PolicyConfig,
    now: float,
    cache: dict[object, Any] | None = None,
) -> str | None:
    """Why the job should wait for a faster model rather than take `placement`, or None to start now.

    `cache` (one per pass) keeps the earliest start per job shape (it does not
    depend on the job's runtime, and a pass weighs many jobs of one shape) and
    the nodes already claimed by a job that waits for them.
    """
    gain = config.wait_for_faster_gain
    req = job.request
    runtime = req.expected_runtime_s
    if gain is None or runtime is None or placement.others or placement.speed <= 0:
        return None  # no estimate to weigh, or a gang placement (not weighed against one node)
    now_finish = runtime / placement.speed
    view = eligible(cluster, req, config.profile)
    speeds_key = ("speeds", id(view), req.workload_class, req.gpus > 1)
    speed_of = cache.get(speeds_key) if cache is not None else None
    if speed_of is None:
        speed_of = {}
        for name in view.nodes:
            model = cluster.nodes[name].model
            if model not in speed_of:
                speed_of[model] = candidate_speed(cluster, req, cluster.nodes[name])
        if cache is not None:
            cache[speeds_key] = speed_of
    # Only a model fast enough that even an immediate start there clears the margin can be worth waiting for.
    faster = tuple(m for m, s in speed_of.items() if runtime / s <= (1.0 - gain) * now_finish)
    if not faster:
        return None
    allowed = tuple(m for m in faster if not req.gpu_models or m in req.gpu_models)
    key = (id(view), req.gpus, req.min_memory_mib, allowed)
    if cache is not None and key in cache:
        start, nodes = cache[key]
    else:
        there = reserve(cluster, replace(job, request=replace(req, gpu_models=allowed)), running, config.profile, now)
        start, nodes = there.start, tuple(sorted(there.spare))
        if cache is not None:
            cache[key] = (start, nodes)
    # Unknown, or free now (placement scored the slower node higher): nothing to wait for.
    if start is None or not nodes or start <= now:
        return None
    slowest = min(speed_of[cluster.nodes[n].model] for n in nodes)
    later_finish = start - now + runtime / slowest
    if later_finish > (1.0 - gain) * now_finish:
        return None
    if cache is not None:
        # The first job (in policy order) to wait claims those nodes: later jobs cannot
        # count on them too, so they start where they fit.
        claimed = cache.setdefault("claimed", set())
        if claimed.intersection(nodes):
            return None
        claimed.update(nodes)
    return (
        f"waits for a faster GPU: {', '.join(nodes[:3])} at t={start:.0f}s finishes it in "
        f"{later_finish / 3600:.1f} h instead of {now_finish / 3600:.1f} h on {placement.model}"
    )
