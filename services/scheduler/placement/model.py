"""What placement reasons about: GPUs, nodes, job requests and the decisions it returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property


@dataclass(frozen=True)
class GpuState:
    uuid: str
    index: int
    memory_total_mib: float
    # What telemetry says is free right now; None until a sample arrives.
    memory_free_mib: float | None = None
    allocated_to: str | None = None
    # The most telemetry says this GPU offers when idle (its nameplate less what the driver and the idle card
    # use); None until a sample arrives: then its nameplate is all that is known.
    memory_idle_mib: float | None = None
    # Quarantined (a fault, or an operator's cordon): never free, whoever holds it now.
    quarantined: bool = False


@dataclass(frozen=True)
class NodeState:
    name: str
    cluster: str
    model: str
    interconnect: str
    gpus: tuple[GpuState, ...]
    schedulable: bool = True
    pool: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    cordoned: bool = False
    draining: bool = False
    # Hottest GPU of the node and the temperature at which it stops taking work.
    temperature_c: float | None = None
    thermal_limit_c: float | None = None
    # Time (seconds, same clock as `now`) of the last critical XID on any of its GPUs.
    last_critical_xid_at: float | None = None
    # A leased or rented node goes away at this time; None for owned nodes.
    lease_expires_at: float | None = None


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    gpus: int
    gpu_models: tuple[str, ...] = ()
    min_memory_mib: float = 0.0
    workload_class: str = "small"
    team: str = "default"
    priority: str = "normal"
    preemptible: bool = False
    pool: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    # Runtime on an A100 80GB (the speed table's unit); None when unknown.
    expected_runtime_s: float | None = None
    # A job larger than one node may span nodes (gang, all or nothing) only if allowed.
    allow_multi_node: bool = False
    # Replicas of one inference service share this name and are spread across nodes.
    service: str | None = None
    # All GPUs on one node whose GPUs are joined by NVLink.
    nvlink: bool = False


@dataclass(frozen=True)
class ModelFacts:
    """What placement needs to know about one GPU model (from gpu_models.yaml)."""

    key: str
    speed: Mapping[str, float] = field(default_factory=dict)
    usd_per_gpu_hour: Decimal | None = None

    def speed_for(self, workload_class: str) -> float:
        """Relative speed of a workload class on this model (A100 = 1.0); 1.0 if unknown."""
        return self.speed.get(workload_class, 1.0)

    @cached_property
    def speed_total(self) -> float:
        """The speeds of every class added up (the scorers' mean; computed once)."""
        return sum(self.speed.values())


@dataclass(frozen=True)
class Interconnects:
    """Efficiency of a multi-GPU job by how its GPUs are connected (multiplies speed)."""

    nvlink: float = 1.0
    pcie: float = 0.75
    cross_node: float = 0.9

    def for_node(self, interconnect: str) -> float:
        """Efficiency of a multi-GPU job inside one node with this interconnect."""
        return self.nvlink if interconnect == "nvlink" else self.pcie


@dataclass(frozen=True)
class NodeShare:
    """The GPUs a job holds on one node."""

    node: str
    cluster: str
    model: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    node: str
    cluster: str
    model: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    # Further nodes of a gang placement that spans nodes; empty for one node.
    others: tuple[NodeShare, ...] = ()
    # Relative speed the job will run at: slowest model's speed x interconnect efficiency.
    speed: float = 1.0
    explanation: str = ""

    @property
    def shares(self) -> tuple[NodeShare, ...]:
        """Every node's part of the placement, this node first."""
        first = NodeShare(self.node, self.cluster, self.model, self.gpu_uuids, self.gpu_indices)
        return (first, *self.others)

    @property
    def gpu_count(self) -> int:
        """GPUs held across all nodes."""
        return len(self.gpu_indices) + sum(len(s.gpu_indices) for s in self.others)


@dataclass(frozen=True)
class Unschedulable:
    """Could run later, when GPUs free up; the reason says what it waits for."""

    reason: str


@dataclass(frozen=True)
class Infeasible:
    """Can never run on this fleet; reject it now."""

    reason: str


Decision = Placement | Unschedulable | Infeasible
