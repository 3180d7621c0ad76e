"""Filter plugins: can this node hold this job? Each returns None, or the reason it cannot.

Static filters look at what never changes while the node exists (model,
memory size, GPU count, pool, labels): when no node passes them the job is
infeasible. Dynamic filters look at the node now (health, lease), and
`usable_gpus` at its free GPUs, judged against the memory telemetry says is
free so that a process WhaleFlux did not start cannot cause an OOM.
"""

from __future__ import annotations

from collections.abc import Callable

from .model import GpuState, JobRequest, NodeState
from .moments import at, span

MIB_PER_GB = 1024

StaticFilter = Callable[[JobRequest, NodeState], "str | None"]
DynamicFilter = Callable[[JobRequest, NodeState, float, "FilterSettings"], "str | None"]


class FilterSettings:
    """Knobs of the dynamic filters."""

    def __init__(self, xid_quarantine_s: float = 600.0, speed_of: Callable[[str, str], float] | None = None) -> None:
        self.xid_quarantine_s = xid_quarantine_s
        # (model, class) -> relative speed, to turn an A100 runtime into this node's runtime.
        self.speed_of = speed_of or (lambda model, klass: 1.0)


def model_allowed(req: JobRequest, node: NodeState) -> str | None:
    """The job lists allowed models and this node's is not one of them."""
    if req.gpu_models and node.model not in req.gpu_models:
        return f"model {node.model} not allowed"
    return None


def gb(mib: float) -> str:
    """MiB as GB in words: "80", "79.6", "79.65"."""
    return f"{mib / MIB_PER_GB:.2f}".rstrip("0").rstrip(".")


def offers_mib(gpu: GpuState) -> float:
    """The most memory the GPU can give a job: what telemetry saw free on it idle, else its nameplate."""
    idle = gpu.memory_idle_mib
    return gpu.memory_total_mib if idle is None else min(idle, gpu.memory_total_mib)


def memory_size(req: JobRequest, node: NodeState) -> str | None:
    """Even an idle GPU of this node has too little memory (as telemetry saw it idle, else by its nameplate)."""
    if not node.gpus or req.min_memory_mib <= 0:
        return None
    best = max(node.gpus, key=offers_mib)
    if offers_mib(best) < req.min_memory_mib:
        if best.memory_idle_mib is None:
            return f"GPU memory below {gb(req.min_memory_mib)} GB ({gb(best.memory_total_mib)} GB)"
        # (to 0.1 GB: cards of one model read alike, so the nodes that lack it are named together)
        idle = f"{offers_mib(best) / MIB_PER_GB:.1f}".removesuffix(".0")
        nameplate = gb(best.memory_total_mib)
        return f"GPU memory below {gb(req.min_memory_mib)} GB ({idle} GB free when idle, of {nameplate})"
    return None


def gpus_per_node(req: JobRequest, node: NodeState) -> str | None:
    """A job that must stay on one node needs a node at least that big."""
    if not req.allow_multi_node and len(node.gpus) < req.gpus:
        return f"only {len(node.gpus)} GPUs per node"
    return None


def interconnect(req: JobRequest, node: NodeState) -> str | None:
    """A multi-GPU job that asks for NVLink needs a node whose GPUs have it."""
    if req.nvlink and node.interconnect != "nvlink":
        return f"{node.interconnect}, not NVLink"
    return None


def pool_and_labels(req: JobRequest, node: NodeState) -> str | None:
    """Pool and label constraints, e.g. data that must stay in pool=onprem."""
    if req.pool and node.pool != req.pool:
        return f"pool {node.pool}, not {req.pool}"
    for key, value in req.labels:
        if node.labels.get(key) != value:
            return f"label {key}!={value}"
    return None


def healthy(req: JobRequest, node: NodeState, now: float, settings: FilterSettings) -> str | None:
    """Not cordoned or draining, below its thermal limit, no recent critical XID."""
    if node.cordoned:
        return "cordoned"
    if node.draining:
        return "draining"
    if not node.schedulable:
        return "not schedulable"
    temp, limit = node.temperature_c, node.thermal_limit_c
    if temp is not None and limit is not None and temp >= limit:
        return f"at {temp:.0f} C, thermal limit {limit:.0f} C"
    if node.last_critical_xid_at is not None and now - node.last_critical_xid_at < settings.xid_quarantine_s:
        return f"critical XID {now - node.last_critical_xid_at:.0f} s ago"
    return None


def lease_covers_runtime(req: JobRequest, node: NodeState, now: float, settings: FilterSettings) -> str | None:
    """A leased node must stay ours for the job's expected runtime on it."""
    if node.lease_expires_at is None:
        return None
    left = node.lease_expires_at - now
    if left <= 0:
        return f"lease ended {at(node.lease_expires_at)}"
    if req.expected_runtime_s is not None:
        needed = req.expected_runtime_s / settings.speed_of(node.model, req.workload_class)
        if needed > left:
            return f"lease ends {at(node.lease_expires_at)}, job needs {span(needed)}"
    return None


def held_elsewhere(req: JobRequest, gpu: GpuState) -> bool:
    """Large enough for the job, but telemetry says less than it needs is actually free."""
    free = gpu.memory_free_mib
    return offers_mib(gpu) >= req.min_memory_mib and free is not None and free < req.min_memory_mib


def usable_gpus(req: JobRequest, gpus: dict[int, GpuState], free: list[int]) -> list[int]:
    """Free GPUs with enough memory, by bookkeeping and by what telemetry says is free."""
    need = req.min_memory_mib
    if need <= 0:
        return free
    out = []
    for i in free:
        gpu = gpus[i]
        if offers_mib(gpu) < need or held_elsewhere(req, gpu):
            continue
        out.append(i)
    return out


def needs(req: JobRequest, gang: bool) -> str:
    """What the job asks for; `gang`: it would span nodes (larger than any node it may use)."""
    text = f"needs {req.gpus} GPU{'s' if req.gpus != 1 else ''}"
    if req.min_memory_mib:
        text += f" with >= {gb(req.min_memory_mib)} GB"
    if req.gpu_models:
        text += f" of {'/'.join(req.gpu_models)}"
    text += " across nodes" if gang else " on one NVLink node" if req.nvlink else " on one node"
    if req.pool:
        text += f" in pool {req.pool}"
    return text


def summary(by_reason: dict[str, list[str]]) -> str:
    parts = []
    for reason, nodes in by_reason.items():
        more = f" +{len(nodes) - 3}" if len(nodes) > 3 else ""
        parts.append(f"{reason} ({', '.join(nodes[:3])}{more})")
    return "; ".join(parts)


STATIC_FILTERS: dict[str, StaticFilter] = {
    "model_allowed": model_allowed,
    "memory_size": memory_size,
    "gpus_per_node": gpus_per_node,
    "pool_and_labels": pool_and_labels,
    "interconnect": interconnect,
}
DYNAMIC_FILTERS: dict[str, DynamicFilter] = {
    "healthy": healthy,
    "lease_covers_runtime": lease_covers_runtime,
}


def may_be_unhealthy(node: NodeState) -> bool:
    """Whether `healthy` can reject this node at any time (else it passes whatever `now` is)."""
    temp, limit = node.temperature_c, node.thermal_limit_c
    return (node.cordoned or node.draining or not node.schedulable or node.last_critical_xid_at is not None
            or (temp is not None and limit is not None and temp >= limit))


def may_lack_lease(node: NodeState) -> bool:
    """Whether `lease_covers_runtime` can reject this node (only a leased node can)."""
    return node.lease_expires_at is not None


# For each dynamic filter, which nodes it can ever reject: the others are not asked, so a pass over a
# healthy fleet never calls a filter per node. A filter with no entry here is asked about every node.
# Dynamic filters look at the job only through its expected runtime and workload class (the pass caches
# what one job shape may do, queueing/schedule.py `_shape`).
MAY_REJECT: dict[str, Callable[[NodeState], bool]] = {
    "healthy": may_be_unhealthy,
    "lease_covers_runtime": may_lack_lease,
}
