"""The burn-in of simulated GPUs: plausible figures from the model's spec, and the faults injected into the node.

Time is virtual: each stress step moves this exerciser's clock, and the node's
thermal model heats through it, so a 2-minute burn-in takes milliseconds. A
`cooling` fault throttles the GPU (thermal check fails, compute drops with the
clock), `vram-flip` leaves a bad cell the memory test finds (counted by ECC
where the model has it), `pcie-degraded` cuts host<->device bandwidth, and a
GPU that is gone (`xid79`, `gpu-vanish`) stops answering.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..simulated import THROTTLED_CLOCK, SimulatedNode, stable_fraction
from .card import BandwidthRun, ComputeRun, MemoryRun
from .ptx import PATTERNS
from .spec import gpu_spec

MIB = 1024 * 1024
# Share of the datasheet each figure reaches on a healthy GPU (what such tests see on real ones).
COMPUTE_EFFICIENCY = 0.88
MEMORY_EFFICIENCY = 0.80
COPY_EFFICIENCY = {"h2d": 0.83, "d2h": 0.86, "d2d": 0.88, "peer": 0.85}
BAD_CELL_ADDRESS = 0x7F3A_4000_1000
BANDWIDTH_TEST_S = 4.0


class SimulatedExerciser:
    """Exerciser over one SimulatedNode (the same object the run samples as its backend)."""

    def __init__(self, node: SimulatedNode, start: datetime):
        self.node = node
        self._start = self._now = start
        spec = gpu_spec(node.model.key)
        if spec is None:
            raise ValueError(f"model: {node.model.key} has no spec in gpu_models.yaml")
        self.spec = spec

    def now(self) -> datetime:
        return self._now

    def _jitter(self, index: int, what: str) -> float:
        """A stable ±2% per GPU and figure, so two GPUs of a node do not read exactly alike."""
        return 1 + 0.04 * (stable_fraction(f"{self.node.seed}:{self.node.node}:{index}:{what}") - 0.5)

    def compute(self, indices: list[int], seconds: float) -> dict[int, ComputeRun]:
        uuids = [g.uuid for g in self.node.identities() if g.index in indices]
        self.node.set_utilization(uuids, 100.0)
        self._now += timedelta(seconds=seconds)
        out = {}
        for i in indices:
            state = self.node.burn_in_state(i)
            if state.gone:
                continue
            clock = THROTTLED_CLOCK if state.throttled else 1.0
            tflops = (self.spec.fp32_tflops or 0.0) * COMPUTE_EFFICIENCY * clock * self._jitter(i, "compute")
            out[i] = ComputeRun(flops=tflops * 1e12 * seconds, seconds=seconds)
        return out

    def memory(self, indices: list[int], fraction: float) -> dict[int, MemoryRun]:
        total = int(self.node.model.memory_mib * MIB)
        free = total - int(round(self.node.model.memory_mib * 0.0056) * MIB) - 512 * MIB
        tested = int(free * fraction)
        gbps = (self.spec.memory_bandwidth_gbps or 1000.0) * MEMORY_EFFICIENCY
        seconds = 2 * tested * len(PATTERNS) / (gbps * 1e9)
        self._now += timedelta(seconds=seconds)
        out = {}
        for i in indices:
            state = self.node.burn_in_state(i)
            if state.gone:
                continue
            mismatches = 0
            if state.flipped_bits:
                # Every pattern's verify reads the cell; ECC corrects a single flipped bit, never two.
                self.node.memory_tested(i, len(PATTERNS))
                if not self.node.model.ecc or state.flipped_bits > 1:
                    mismatches = len(PATTERNS)
            out[i] = MemoryRun(bytes_tested=tested, bytes_total=total, passes=len(PATTERNS), mismatches=mismatches,
                               seconds=seconds * self._jitter(i, "memory"),
                               bad_addresses=(BAD_CELL_ADDRESS,) if mismatches else ())
        return out

    def bandwidth(self, indices: list[int]) -> dict[int, BandwidthRun]:
        self._now += timedelta(seconds=BANDWIDTH_TEST_S)
        nvlink = self.node.interconnect == "nvlink" and bool(self.spec.nvlink_gbps)
        peer_spec = (self.spec.nvlink_gbps if nvlink else self.spec.pcie_gbps) or 0.0
        out = {}
        for i in indices:
            state = self.node.burn_in_state(i)
            if state.gone:
                continue
            pcie = (self.spec.pcie_gbps or 0.0) * state.pcie_width / 16
            out[i] = BandwidthRun(
                h2d_gbps=pcie * COPY_EFFICIENCY["h2d"] * self._jitter(i, "h2d"),
                d2h_gbps=pcie * COPY_EFFICIENCY["d2h"] * self._jitter(i, "d2h"),
                d2d_gbps=(self.spec.memory_bandwidth_gbps or 0.0) * COPY_EFFICIENCY["d2d"] * self._jitter(i, "d2d"),
                peer_gbps={p: peer_spec * COPY_EFFICIENCY["peer"] * self._jitter(i, f"peer{p}")
                           for p in indices if p != i and not self.node.burn_in_state(p).gone},
                peer_link="nvlink" if nvlink else "pcie",
            )
        return out

    def close(self) -> None:
        """Hand the node back to real time: its next sample follows on from the burn-in's start."""
        self.node.resume_at(self._start)
