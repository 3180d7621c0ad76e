"""What a rule keeps per series (one GPU, node or event key) and what evaluating it gives. Pure."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..config import RuleBase
from .trend import Window


class Cond(enum.Enum):
    """A rule's condition on one series: holds (FIRE), clearly does not (CLEAR), or in between (HOLD)."""

    FIRE = "fire"
    HOLD = "hold"
    CLEAR = "clear"


# (condition, the value measured, template values for the summary)
Verdict = tuple[Cond, float | None, dict[str, Any]]


@dataclass(frozen=True)
class RemovedRule:
    """Stands in for a rule deleted from the file while its alert fired."""

    name: str
    severity: str = "info"
    category: str = "health"
    actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Transition:
    """An alert starts (`firing`) or stops firing."""

    firing: bool
    rule: RuleBase | RemovedRule
    fingerprint: str
    labels: dict[str, str]  # without alertname
    summary: str
    at: datetime
    value: float | None = None
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    rack: str | None = None
    pool: str | None = None
    # From node.registered: (UUID, marketing name, PCI bus id) of each GPU, for dcgm-exporter's label values.
    gpus: tuple[tuple[str, str, str], ...] = ()

    def labels(self) -> dict[str, str]:
        """`rack` and `pool` labels, where known."""
        return {**({"rack": self.rack} if self.rack else {}), **({"pool": self.pool} if self.pool else {})}

    def gpu_labels(self, uuid: str, node: str) -> dict[str, str]:
        """dcgm-exporter's values for a GPU's alert: `modelName` as the device names itself ("NVIDIA
        A100-SXM4-80GB", as on /metrics), `pci_bus_id`, and `instance` (the node, as telemetry's /metrics)."""
        out = {"instance": node}
        for gpu_uuid, name, bus in self.gpus:
            if gpu_uuid == uuid:
                out.update({"modelName": name} if name else {})
                out.update({"pci_bus_id": bus} if bus else {})
        return out

    def to_json(self) -> dict[str, object]:
        return {"rack": self.rack, "pool": self.pool, "gpus": [list(g) for g in self.gpus]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> NodeInfo:
        gpus = tuple((str(u), str(n), str(b)) for u, n, b in raw.get("gpus") or [])
        return cls(rack=raw.get("rack"), pool=raw.get("pool"), gpus=gpus)


@dataclass
class Series:
    firing: bool = False
    pending_since: float | None = None
    points: Window = field(default_factory=Window)
    last_hit: float | None = None
    owner: tuple[tuple[str, int], ...] | None = None  # trend rules: the processes on the GPU (job id, pid)
    workload_class: str | None = None  # baseline rules: the GPU's class now ...
    class_since: float = 0.0  # ... since when
    deadline: float | None = None  # event alerts: resolve at this time
    steady_ref: float | None = None  # rate rules with steady_metric: the level it holds ...
    steady_smooth: float | None = None  # ... its smoothed value ...
    steady_since: float | None = None  # ... and since when
    steady_t: float | None = None  # time of the last steady-metric sample
    safe_since: float | None = None  # threshold rules with resolve_under_load: back on the safe side since
    labels: dict[str, str] = field(default_factory=dict)

    def hold(self) -> Cond:
        """No verdict either way: a firing alert stays, a quiet one stays quiet."""
        return Cond.HOLD if self.firing else Cond.CLEAR


def fingerprint(labels: dict[str, str]) -> str:
    """Stable id of an alert: the same labels always give the same fingerprint."""
    canon = "\x00".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def render(template: str, values: dict[str, Any]) -> str:
    """Format a summary template; a bad field or spec leaves the template readable rather than failing."""
    try:
        return template.format_map(_Missing(values))
    except (ValueError, TypeError, IndexError, AttributeError):
        return template
