"""Simulated GPUs of one node: physically plausible, seeded, deterministic.

Utilization follows the jobs running on each GPU; power moves between idle and
TDP with utilization; temperature follows power through a first-order thermal
model (T -> ambient + R * P with time constant TAU_S); above the slowdown
temperature the SM clock is throttled with the thermal reason; energy is the
integral of power.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import datetime

from whaleflux.shared.catalog import GpuModel
from whaleflux.shared.events import GpuIdentity, GpuSample

TAU_S = 30.0
BASE_SM_CLOCK = {"H100": 1980, "H200": 1980, "A100": 1410, "RTX4090": 2520}
MEM_CLOCK = {"H100": 2619, "H200": 3201, "A100": 1593, "RTX4090": 10501}


@dataclass
class _Gpu:
    identity: GpuIdentity
    model: GpuModel
    temperature_c: float
    energy_j: float = 0.0
    job: str | None = None
    cooling_factor: float = 1.0  # >1 means worse cooling (fault injection)
    ecc_uncorrected: int = 0


@dataclass
class SimulatedNode:
    node: str
    model: GpuModel
    gpu_count: int
    seed: int = 0
    ambient_c: float = 25.0
    _gpus: list[_Gpu] = field(default_factory=list)
    _last: datetime | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}:{self.node}")
        for i in range(self.gpu_count):
            digest = hashlib.sha256(f"{self.node}:{i}".encode()).hexdigest()
            uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
            identity = GpuIdentity(
                uuid=uuid,
                index=i,
                model=self.model.key,
                name=self.model.names[0],
                serial=str(int(digest[32:44], 16))[:13],
                memory_total_mib=self.model.memory_mib,
                pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                driver_version="565.57.01",
                vbios_version="96.00.99.00.01",
            )
            self._gpus.append(_Gpu(identity, self.model, temperature_c=self._steady(self.model.idle_power_w)))

    # Thermal resistance chosen so a GPU at TDP settles ~20 C under its slowdown limit.
    def _resistance(self) -> float:
        return (self.model.temp_slowdown_c - 20 - self.ambient_c) / self.model.tdp_w

    def _steady(self, power_w: float, cooling: float = 1.0) -> float:
        return self.ambient_c + power_w * self._resistance() * cooling

    def identities(self) -> list[GpuIdentity]:
        return [g.identity for g in self._gpus]

    def job_started(self, gpu_uuids: list[str], job_id: str) -> None:
        for g in self._gpus:
            if g.identity.uuid in gpu_uuids:
                g.job = job_id

    def job_stopped(self, gpu_uuids: list[str]) -> None:
        for g in self._gpus:
            if g.identity.uuid in gpu_uuids:
                g.job = None

    def inject_cooling_failure(self, index: int, factor: float = 3.0) -> None:
        """Cooling failure: the GPU's temperature runs away toward a much higher steady state."""
        self._gpus[index].cooling_factor = factor

    def sample(self, now: datetime) -> list[GpuSample]:
        dt = 1.0 if self._last is None else max((now - self._last).total_seconds(), 0.0)
        self._last = now
        m = self.model
        out = []
        for g in self._gpus:
            util = min(100.0, max(0.0, self._rng.gauss(92, 4))) if g.job else 0.0
            power = m.idle_power_w + (m.tdp_w - m.idle_power_w) * util / 100
            target = self._steady(power, g.cooling_factor)
            g.temperature_c += (target - g.temperature_c) * min(dt / TAU_S, 1.0)
            g.energy_j += power * dt
            throttled = g.temperature_c >= m.temp_slowdown_c
            sm_clock = BASE_SM_CLOCK.get(m.key, 1500) * (0.6 if throttled else 1.0)
            used = (0.55 * m.memory_mib if g.job else 0.0) + 512
            out.append(
                GpuSample(
                    uuid=g.identity.uuid,
                    index=g.identity.index,
                    model=m.key,
                    utilization_gpu_pct=round(util, 1),
                    utilization_memory_pct=round(util * 0.6, 1),
                    memory_used_mib=round(used, 1),
                    memory_total_mib=m.memory_mib,
                    temperature_c=round(g.temperature_c, 1),
                    memory_temperature_c=round(g.temperature_c + 6, 1) if m.mem_temp_max_c else None,
                    slowdown_temperature_c=m.temp_slowdown_c,
                    power_w=round(power, 1),
                    power_limit_w=m.tdp_w,
                    energy_j=round(g.energy_j, 1),
                    sm_clock_mhz=round(sm_clock),
                    mem_clock_mhz=MEM_CLOCK.get(m.key),
                    throttle_reasons=["sw_thermal_slowdown", "hw_thermal_slowdown"] if throttled else [],
                    ecc_uncorrected=g.ecc_uncorrected if m.ecc else None,
                )
            )
        return out
