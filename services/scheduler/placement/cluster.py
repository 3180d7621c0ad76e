"""A mutable index of the fleet's free GPUs, so placement never rescans every node.

Nodes sit in buckets by (model, free GPU count): best fit walks the buckets
upward from the job's size and stops after a few candidates, whatever the
fleet's size. Allocation and release keep the buckets current in O(GPUs of
the job). Pure data structure, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from .model import GpuState, Interconnects, ModelFacts, NodeShare, NodeState, Placement

T = TypeVar("T")


@dataclass
class StaticView:
    """Nodes that could ever hold one shape of job, computed once per shape."""

    nodes: list[str]  # fleet order
    members: set[str]
    models: list[str]
    max_gpus_per_node: int
    total_gpus: int
    rejections: dict[str, list[str]] = field(default_factory=dict)
    firsts: dict[str, str] = field(default_factory=dict)  # model -> its first node (fleet order)

    @classmethod
    def of(cls, nodes: Mapping[str, NodeState], names: list[str], rejections: dict[str, list[str]]) -> StaticView:
        """The view of these nodes (fleet order), with why the others were left out."""
        firsts: dict[str, str] = {}
        biggest = total = 0
        for name in names:
            node = nodes[name]
            biggest = max(biggest, len(node.gpus))
            total += len(node.gpus)
            firsts.setdefault(node.model, name)
        return cls(names, set(names), list(firsts), biggest, total, rejections, firsts)


class ClusterState:
    """Free GPUs per node, bucketed by model and free count; allocations per job."""

    def __init__(
        self,
        nodes: Iterable[NodeState],
        facts: Mapping[str, ModelFacts] | None = None,
        interconnects: Interconnects | None = None,
    ) -> None:
        self.facts: dict[str, ModelFacts] = dict(facts or {})
        self.interconnects = interconnects or Interconnects()
        self.nodes: dict[str, NodeState] = {}
        self.order: dict[str, int] = {}
        self.gpus: dict[str, dict[int, GpuState]] = {}
        self.free: dict[str, list[int]] = {}
        # model -> [free count] -> node names (a dict keeps insertion order: runs are reproducible)
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.free_by_model: Counter[str] = Counter()
        self.total_gpus = 0
        self.total_free = 0
        self.holdings: dict[str, tuple[NodeShare, ...]] = {}
        self.jobs_on: dict[str, dict[str, None]] = {}  # node -> the jobs holding GPUs on it
        self.services_on: dict[str, Counter[str]] = {}
        self._service_of: dict[str, str] = {}
        self.views: dict[tuple[object, ...], StaticView] = {}  # static views by shape (framework.eligible)
        # Shapes with the same eligible nodes share one view (and so one cache key in a pass).
        self._interned: dict[tuple[str, ...], StaticView] = {}
        # Facts derived from the nodes' states (not their free GPUs), kept until a node changes.
        self._derived: dict[tuple[object, ...], object] = {}
        self.has_memory_telemetry = False
        self.has_leases = False
        self.memory: dict[str, float] = {}  # node -> its largest GPU memory (MiB), for nodes with GPUs
        # node -> its smallest GPU memory (MiB) when no GPU of it has measured free memory, else -1: a job
        # needing at most that may use every free GPU of the node without asking each one.
        self.memory_floor: dict[str, float] = {}
        self._speeds: dict[tuple[str, str], float] = {}
        # Count every allocation, release and node update (`changes`), and those that may free a GPU or make
        # a node usable (`freed`: releases and updates): equal counts, the same state; equal `freed`, no more room.
        self.changes = 0
        self.freed = 0
        for node in nodes:
            self._add(node)
        # Jobs already holding GPUs in the snapshot (the service's bookkeeping).
        for node in self.nodes.values():
            for gpu in node.gpus:
                if gpu.allocated_to is not None:
                    held = self.holdings.get(gpu.allocated_to, ())
                    self.holdings[gpu.allocated_to] = _add_gpu(held, node, gpu)
                    self.jobs_on[node.name][gpu.allocated_to] = None

    def _add(self, node: NodeState) -> None:
        self.order[node.name] = len(self.order)
        self.nodes[node.name] = node
        self._memory_of(node)
        self.gpus[node.name] = {g.index: g for g in node.gpus}
        free = sorted(g.index for g in node.gpus if g.allocated_to is None and not g.quarantined)
        self.free[node.name] = free
        self.services_on[node.name] = Counter()
        self.jobs_on[node.name] = {}
        buckets = self.buckets.setdefault(node.model, [])
        while len(buckets) <= len(node.gpus):
            buckets.append({})
        buckets[len(free)][node.name] = None
        self.free_by_model[node.model] += len(free)
        self.total_gpus += len(node.gpus)
        self.total_free += len(free)
        self.has_leases = self.has_leases or node.lease_expires_at is not None
        self.has_memory_telemetry = self.has_memory_telemetry or any(g.memory_free_mib is not None for g in node.gpus)

    def _memory_of(self, node: NodeState) -> None:
        if node.gpus:
            self.memory[node.name] = max(g.memory_total_mib for g in node.gpus)
        measured = any(g.memory_free_mib is not None for g in node.gpus)
        self.memory_floor[node.name] = -1.0 if measured or not node.gpus else min(
            g.memory_total_mib if g.memory_idle_mib is None else min(g.memory_idle_mib, g.memory_total_mib)
            for g in node.gpus)

    # ------------------------------------------------------------ facts

    def speed(self, model: str, workload_class: str) -> float:
        """Relative speed of a class on a model (1.0 when the model has no facts; kept once asked)."""
        key = (model, workload_class)
        speed = self._speeds.get(key)
        if speed is None:
            facts = self.facts.get(model)
            speed = self._speeds[key] = facts.speed_for(workload_class) if facts else 1.0
        return speed

    def static_view(self, key: tuple[object, ...], build: Callable[[], StaticView]) -> StaticView:
        """The cached static eligibility for one job shape; `build` computes it once."""
        view = self.views.get(key)
        if view is None:
            built = build()
            view = self.views[key] = self._interned.setdefault(tuple(built.nodes), built) if built.nodes else built
        return view

    def freeable(self, share: NodeShare) -> int:
        """How many of a holding's GPUs come free when its job ends (a quarantined GPU does not)."""
        gpus = self.gpus[share.node]
        return sum(1 for i in share.gpu_indices if not gpus[i].quarantined)

    def derived(self, key: tuple[object, ...], build: Callable[[], T]) -> T:
        """A fact computed from the nodes' states (health, labels, leases) once, until a node changes."""
        if key not in self._derived:
            self._derived[key] = build()
        return cast(T, self._derived[key])

    def with_free(self, view: StaticView) -> list[str]:
        """The view's nodes that have a free GPU, in fleet order (from the buckets: few on a busy fleet)."""
        members, order = view.members, self.order
        names = [n for m in view.models for bucket in self.buckets[m][1:] for n in bucket if n in members]
        names.sort(key=order.__getitem__)
        return names

    # ------------------------------------------------------------ changes

    def update_node(self, node: NodeState) -> None:
        """Take a node's new health and labels; its allocations stay as they are."""
        old = self.nodes[node.name]
        if old.model != node.model or len(old.gpus) != len(node.gpus):
            raise ValueError(f"node {node.name} changed model or GPU count; rebuild the cluster state")
        self.changes += 1
        self.freed += 1
        self.nodes[node.name] = node
        self.gpus[node.name] = {g.index: g for g in node.gpus}
        self._memory_of(node)
        self.has_leases = self.has_leases or node.lease_expires_at is not None
        self.has_memory_telemetry = self.has_memory_telemetry or any(g.memory_free_mib is not None for g in node.gpus)
        self.views.clear()
        self._interned.clear()
        self._derived.clear()

    def _move(self, name: str, before: int, after: int) -> None:
        model = self.nodes[name].model
        buckets = self.buckets[model]
        del buckets[before][name]
        buckets[after][name] = None
        self.free_by_model[model] += after - before
        self.total_free += after - before

    def allocate(self, job_id: str, placement: Placement, service: str | None = None) -> None:
        """Mark the placement's GPUs as held by the job."""
        if job_id in self.holdings:
            raise ValueError(f"job {job_id} already holds GPUs")
        self.changes += 1
        for share in placement.shares:
            free = self.free[share.node]
            before = len(free)
            taken = set(share.gpu_indices)
            if not taken.issubset(free):
                raise ValueError(f"GPUs {sorted(taken - set(free))} of {share.node} are not free")
            self.free[share.node] = [i for i in free if i not in taken]
            self._move(share.node, before, before - len(taken))
            self.jobs_on[share.node][job_id] = None
            if service:
                self.services_on[share.node][service] += 1
        self.holdings[job_id] = placement.shares
        if service:
            self._service_of[job_id] = service

    def release(self, job_id: str) -> tuple[NodeShare, ...]:
        """Free the job's GPUs; returns what it held (nothing if it held nothing)."""
        shares = self.holdings.pop(job_id, ())
        service = self._service_of.pop(job_id, None)
        self.changes += 1
        self.freed += 1
        for share in shares:
            free = self.free[share.node]
            before = len(free)
            gpus = self.gpus[share.node]
            back = [i for i in share.gpu_indices if not gpus[i].quarantined]  # a quarantined GPU stays out
            self.free[share.node] = sorted([*free, *back])
            self._move(share.node, before, before + len(back))
            self.jobs_on[share.node].pop(job_id, None)
            if service:
                self.services_on[share.node][service] -= 1
        return shares


def _add_gpu(held: tuple[NodeShare, ...], node: NodeState, gpu: GpuState) -> tuple[NodeShare, ...]:
    for i, share in enumerate(held):
        if share.node == node.name:
            grown = replace(share, gpu_uuids=(*share.gpu_uuids, gpu.uuid), gpu_indices=(*share.gpu_indices, gpu.index))
            return (*held[:i], grown, *held[i + 1 :])
    return (*held, NodeShare(node.name, node.cluster, node.model, (gpu.uuid,), (gpu.index,)))
