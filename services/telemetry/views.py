"""What the telemetry API answers: a GPU's latest sample with its flags and job, node and fleet summaries. No I/O."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from whaleflux.shared.events import GpuSample
from whaleflux.shared.fleet_health import Health, fleet_health, node_health
from whaleflux.shared.gpu_flags import flags


class LatestSample(BaseModel):
    cluster: str
    node: str
    seq: int
    sample_time: str
    gpu: GpuSample


class JobRef(BaseModel):
    job_id: str
    name: str | None = None
    team: str | None = None
    project: str | None = None


class GpuStatus(LatestSample):
    """The latest sample with what the monitor needs: age, flags, last XID and the job holding the GPU."""

    age_s: float
    stale: bool
    flags: list[str]
    last_xid: int | None = None
    job: JobRef | None = None


class NodeSummary(BaseModel):
    cluster: str
    node: str
    gpus: int
    model: str
    util_mean_pct: float
    power_w: float | None
    memory_used_mib: float
    memory_total_mib: float
    last_sample_time: str
    stale: bool
    flagged_gpus: int
    health: Health  # `unknown` while every GPU of the node is stale (shared/fleet_health.py)


def status(s: LatestSample, last_xid: int | None, job: JobRef | None, now: datetime, stale_after_s: float) -> GpuStatus:
    """The sample's age and flags at `now`; stale after `stale_after_s`."""
    age = now.timestamp() - datetime.fromisoformat(s.sample_time).timestamp()
    stale = age > stale_after_s
    return GpuStatus(**s.model_dump(), age_s=round(age, 3), stale=stale, flags=flags(s.gpu, last_xid, stale),
                     last_xid=last_xid, job=job)


def node_summary(cluster: str, node: str, gs: list[GpuStatus]) -> NodeSummary:
    """One node's GPUs summed up: mean utilization, power, memory, last sample, flagged GPUs."""
    powers = [g.gpu.power_w for g in gs if g.gpu.power_w is not None]
    flagged = sum(1 for g in gs if g.flags)
    return NodeSummary(
        cluster=cluster,
        node=node,
        gpus=len(gs),
        model=gs[0].gpu.model,
        util_mean_pct=round(sum(g.gpu.utilization_gpu_pct for g in gs) / len(gs), 1),
        power_w=round(sum(powers), 1) if powers else None,
        memory_used_mib=round(sum(g.gpu.memory_used_mib for g in gs), 1),
        memory_total_mib=round(sum(g.gpu.memory_total_mib for g in gs), 1),
        last_sample_time=max(g.sample_time for g in gs),
        stale=all(g.stale for g in gs),
        flagged_gpus=flagged,
        health=node_health(len(gs), sum(1 for g in gs if g.stale), flagged),
    )


def node_summaries(gpus: list[GpuStatus]) -> list[NodeSummary]:
    """One summary per node, sorted by cluster and node."""
    grouped: dict[tuple[str, str], list[GpuStatus]] = {}
    for g in gpus:
        grouped.setdefault((g.cluster, g.node), []).append(g)
    return [node_summary(c, n, gs) for (c, n), gs in sorted(grouped.items())]


def fleet(gpus: list[GpuStatus]) -> dict[str, Any]:
    """Fleet totals: its health (`unknown` with no fresh sample), GPUs and nodes reporting, by model, and how many
    are stale, hot, throttled or erroring."""
    by_model: dict[str, dict[str, float]] = {}
    for g in gpus:
        m = by_model.setdefault(g.gpu.model, {"gpus": 0, "util_sum": 0.0, "power_w": 0.0, "memory_used_mib": 0.0,
                                              "memory_total_mib": 0.0})
        m["gpus"] += 1
        m["util_sum"] += g.gpu.utilization_gpu_pct
        m["power_w"] += g.gpu.power_w or 0.0
        m["memory_used_mib"] += g.gpu.memory_used_mib
        m["memory_total_mib"] += g.gpu.memory_total_mib
    for m in by_model.values():
        m["util_mean_pct"] = round(m.pop("util_sum") / m["gpus"], 1)
        m["power_w"] = round(m["power_w"], 1)

    def count(flag: str) -> int:
        return sum(1 for g in gpus if flag in g.flags)

    stale = count("stale")
    troubled = sum(1 for g in gpus if {"hot", "throttled", "xid", "ecc", "nvlink"} & set(g.flags))
    return {
        "health": fleet_health(len(gpus), stale, troubled),
        "gpus": len(gpus),
        "nodes": len({(g.cluster, g.node) for g in gpus}),
        "power_w": round(sum(g.gpu.power_w or 0.0 for g in gpus), 1),
        "stale": stale,
        "hot": count("hot"),
        "throttled": count("throttled"),
        "erroring": sum(1 for g in gpus if {"xid", "ecc", "nvlink"} & set(g.flags)),
        "with_job": sum(1 for g in gpus if g.job),
        "by_model": by_model,
    }
