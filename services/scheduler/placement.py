"""Placement core: pure functions, no I/O.

`place(request, nodes)` runs the stages filter -> score -> select and returns a
`Placement`, or says why not: `Unschedulable` (could run later, when GPUs free
up) or `Infeasible` (can never run on this fleet; reject it now).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuState:
    uuid: str
    index: int
    memory_total_mib: float
    # What telemetry says is free right now; None until a sample arrives.
    memory_free_mib: float | None = None
    allocated_to: str | None = None


@dataclass(frozen=True)
class NodeState:
    name: str
    cluster: str
    model: str
    interconnect: str
    gpus: tuple[GpuState, ...]
    schedulable: bool = True


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    gpus: int
    gpu_models: tuple[str, ...] = ()
    min_memory_mib: float = 0.0


@dataclass(frozen=True)
class Placement:
    node: str
    cluster: str
    model: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Unschedulable:
    reason: str


@dataclass(frozen=True)
class Infeasible:
    reason: str


Decision = Placement | Unschedulable | Infeasible


@dataclass
class _Rejections:
    """Why each node was filtered out, for the explanation users see."""

    by_reason: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, node: str) -> None:
        self.by_reason.setdefault(reason, []).append(node)

    def summary(self) -> str:
        parts = [f"{reason} ({', '.join(sorted(nodes)[:3])}{'…' if len(nodes) > 3 else ''})" for reason, nodes in self.by_reason.items()]
        return "; ".join(parts)


def _fits_ever(req: JobRequest, node: NodeState) -> str | None:
    """Static filters: could this node ever hold the job? Return the reason if not."""
    if req.gpu_models and node.model not in req.gpu_models:
        return f"model {node.model} not allowed"
    if node.gpus and max(g.memory_total_mib for g in node.gpus) < req.min_memory_mib:
        return f"GPU memory below {req.min_memory_mib:.0f} MiB"
    if len(node.gpus) < req.gpus:
        return f"only {len(node.gpus)} GPUs per node"
    return None


def _free_gpus(req: JobRequest, node: NodeState) -> list[GpuState]:
    """Dynamic filter: GPUs unallocated now with enough memory actually free."""
    out = []
    for gpu in node.gpus:
        if gpu.allocated_to is not None or gpu.memory_total_mib < req.min_memory_mib:
            continue
        if gpu.memory_free_mib is not None and gpu.memory_free_mib < req.min_memory_mib:
            continue  # something WhaleFlux did not start holds the memory
        out.append(gpu)
    return out


def place(req: JobRequest, nodes: list[NodeState]) -> Decision:
    """Pick GPUs for one job on one node (best fit: leave the least free behind)."""
    if not nodes:
        return Unschedulable("no GPU nodes registered yet")
    static = _Rejections()
    candidates: list[NodeState] = []
    for node in nodes:
        reason = _fits_ever(req, node)
        if reason:
            static.add(reason, node.name)
        else:
            candidates.append(node)
    if not candidates:
        return Infeasible(f"needs {req.gpus} GPU(s) on one node; no node can ever fit: {static.summary()}")

    dynamic = _Rejections()
    scored: list[tuple[int, str, NodeState, list[GpuState]]] = []
    for node in candidates:
        if not node.schedulable:
            dynamic.add("not schedulable", node.name)
            continue
        free = _free_gpus(req, node)
        if len(free) < req.gpus:
            dynamic.add(f"{len(free)} free GPU(s)", node.name)
            continue
        # Best fit: fewer GPUs left over after placing means less fragmentation.
        scored.append((len(free) - req.gpus, node.name, node, free))
    if not scored:
        return Unschedulable(f"waiting for {req.gpus} free GPU(s): {dynamic.summary()}")
    _, _, node, free = min(scored, key=lambda item: (item[0], item[1]))
    chosen = sorted(free, key=lambda g: g.index)[: req.gpus]
    return Placement(
        node=node.name,
        cluster=node.cluster,
        model=node.model,
        gpu_uuids=tuple(g.uuid for g in chosen),
        gpu_indices=tuple(g.index for g in chosen),
    )
