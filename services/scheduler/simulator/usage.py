"""GPU time held, over the fleet and over the GPUs waiting jobs could use, integrated over a replay."""

from __future__ import annotations

from collections import Counter

from ..placement import ClusterState
from ..placement.cluster import StaticView


class Usage:
    """Integrals of held GPUs over time; `waiting` tracks which static views the waiting jobs have."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.alloc_gpu_s = 0.0  # every held GPU-second
        self.waiting_s = 0.0  # seconds in which a job waited
        self.alloc_while_waiting = 0.0  # held GPU-seconds in those seconds
        self.usable_gpu_s = 0.0  # GPU-seconds some waiting job could use, in those seconds
        self.usable_held_gpu_s = 0.0  # of those, held
        self._views: dict[int, list[str]] = {}
        self._waiting: Counter[int] = Counter()
        self._nodes_of: dict[frozenset[int], tuple[list[str], int]] = {}

    def waiting(self, view: StaticView, delta: int) -> None:
        """A job with this static view starts (-1) or stops (+1) waiting."""
        self._views.setdefault(id(view), view.nodes)
        self._waiting[id(view)] += delta

    def advance(self, dt: float, jobs_wait: bool) -> None:
        """`dt` seconds pass with the cluster as it is."""
        cluster = self.cluster
        held = cluster.total_gpus - cluster.total_free
        self.alloc_gpu_s += held * dt
        if not jobs_wait or dt <= 0:
            return
        self.waiting_s += dt
        self.alloc_while_waiting += held * dt
        key = frozenset(k for k, n in self._waiting.items() if n > 0)
        found = self._nodes_of.get(key)
        if found is None:
            names = sorted({n for k in key for n in self._views[k]})
            found = self._nodes_of[key] = (names, sum(len(cluster.gpus[n]) for n in names))
        names, total = found
        self.usable_gpu_s += total * dt
        self.usable_held_gpu_s += (total - sum(len(cluster.free[n]) for n in names)) * dt

    @property
    def busy(self) -> float:
        """Held GPU-seconds while jobs waited over fleet GPU-seconds then."""
        return self.alloc_while_waiting / (self.cluster.total_gpus * self.waiting_s) if self.waiting_s else 1.0

    @property
    def busy_usable(self) -> float:
        """Held over usable GPU-seconds while jobs waited (the headline)."""
        return self.usable_held_gpu_s / self.usable_gpu_s if self.usable_gpu_s else 1.0
