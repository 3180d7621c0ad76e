"""Simulated GPUs of one node: physically plausible, seeded, deterministic.

Utilization and memory follow the jobs running on each GPU; power moves between
idle and TDP with utilization; temperature follows power through a first-order
thermal model (T -> ambient + R * P with time constant TAU_S), with an ambient
that differs per rack; above the slowdown temperature the SM clock is throttled
with the thermal reasons, at the power limit with the power-cap reason; energy
is the integral of power. Faults (see faults.py) change that behaviour from the
next sample on. Same seed, same node, same calls: same samples.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import datetime

from whaleflux.shared.catalog import GpuModel
from whaleflux.shared.events import GpuIdentity, GpuProcess, GpuSample

from .faults import Fault

TAU_S = 30.0
# The pid a simulated foreign process (not started by WhaleFlux) shows in a sample.
FOREIGN_PID = 4242
NOMINAL_AMBIENT_C = 25.0
BASE_SM_CLOCK = {"H100": 1980, "H200": 1980, "A100": 1410, "RTX4090": 2520}
# Idle (no process on the GPU): clocks drop to their idle state and only the driver's ~1 MiB is in use;
# a process's CUDA context (CONTEXT_MIB) comes with the process.
IDLE_SM_CLOCK = {"H100": 345, "H200": 345, "A100": 210, "RTX4090": 210}
IDLE_USED_MIB = 1.0
CONTEXT_MIB = 512.0
MEM_CLOCK = {"H100": 2619, "H200": 3201, "A100": 1593, "RTX4090": 10501}
# Consumer cards have no DCP profiling counters, ECC, remapping or HBM temperature sensor.
DATACENTER = {"H100", "H200", "A100"}
NVLINK_LINKS = {"H100": 18, "H200": 18, "A100": 12}
CRC_BURST_S = 5
# SM clock (and so dynamic power) of a thermally throttled GPU, as a share of its base clock.
THROTTLED_CLOCK = 0.6


def stable_fraction(text: str) -> float:
    """A stable number in [0, 1) derived from `text` (no global random state)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


@dataclass(frozen=True)
class BurnInState:
    """What a burn-in meets on one simulated GPU: its bad cell, its PCIe link, whether it is gone or throttled."""

    flipped_bits: int
    pcie_width: int
    gone: bool
    throttled: bool


@dataclass
class _Gpu:
    identity: GpuIdentity
    model: GpuModel
    temperature_c: float
    energy_j: float = 0.0
    job: str | None = None
    pid: int | None = None
    util_pct: float = 92.0  # mean utilization of the job running (a training job keeps the GPU ~92% busy)
    cooling_factor: float = 1.0  # >1 means worse cooling (fault injection)
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_uncorrectable: int = 0
    nvlink_crc_errors: int = 0
    nvlink_bytes: float = 0.0
    crc_burst_left: list[int] = field(default_factory=list)
    leak_mib: float = 0.0
    leak_rate: float = 0.0
    foreign_mib: float = 0.0  # held by a process WhaleFlux did not start
    pending_xids: list[int] = field(default_factory=list)
    lost_after_report: bool = False  # XID 79: report it once, then stop answering
    gone: bool = False
    flipped_bits: int = 0  # vram-flip: a cell of this many flipped bits, found by a burn-in's memory test
    pcie_width: int = 16  # pcie-degraded: lanes the link trained at


@dataclass
class SimulatedNode:
    node: str
    model: GpuModel
    gpu_count: int
    seed: int = 0
    ambient_c: float | None = None
    rack: str | None = None
    interconnect: str = "pcie"
    _gpus: list[_Gpu] = field(default_factory=list)
    _last: datetime | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}:{self.node}")
        if self.ambient_c is None:
            # Racks differ: 22-28 C inlet, fixed per rack (or node when no rack is given).
            self.ambient_c = 22.0 + 6.0 * stable_fraction(f"{self.seed}:{self.rack or self.node}")
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

    # Thermal resistance chosen so a GPU at TDP in a nominal room settles ~20 C under its slowdown limit.
    def _resistance(self) -> float:
        return (self.model.temp_slowdown_c - 20 - NOMINAL_AMBIENT_C) / self.model.tdp_w

    def _steady(self, power_w: float, cooling: float = 1.0) -> float:
        ambient = self.ambient_c if self.ambient_c is not None else NOMINAL_AMBIENT_C
        return ambient + power_w * self._resistance() * cooling

    def identities(self) -> list[GpuIdentity]:
        return [g.identity for g in self._gpus]

    def job_started(self, gpu_uuids: list[str], job_id: str, pid: int | None = None, util_pct: float = 92.0) -> None:
        """A job runs on these GPUs from now on, keeping them `util_pct` busy on average."""
        for g in self._gpus:
            if g.identity.uuid in gpu_uuids:
                g.job, g.pid, g.util_pct = job_id, pid, util_pct

    def set_utilization(self, gpu_uuids: list[str], util_pct: float) -> None:
        """The running job's load changes (an inference service's traffic goes up or down)."""
        for g in self._gpus:
            if g.identity.uuid in gpu_uuids:
                g.util_pct = util_pct

    def job_stopped(self, gpu_uuids: list[str]) -> None:
        for g in self._gpus:
            if g.identity.uuid in gpu_uuids:
                # A leak dies with the process that leaked.
                g.job, g.pid, g.leak_mib, g.leak_rate = None, None, 0.0, 0.0

    def inject_cooling_failure(self, index: int, factor: float = 3.0) -> None:
        """Cooling failure: the GPU's temperature runs away toward a much higher steady state."""
        self._gpus[index].cooling_factor = factor

    def inject(self, fault: Fault) -> str:
        """Apply a GPU fault from the next sample on; return what was done."""
        if fault.gpu is None or not 0 <= fault.gpu < len(self._gpus):
            raise ValueError(f"gpu: node {self.node} has GPUs 0..{len(self._gpus) - 1}, not {fault.gpu}")
        g = self._gpus[fault.gpu]
        if g.gone:
            raise ValueError(f"gpu: GPU {fault.gpu} of {self.node} is already gone")
        m = self.model
        if fault.kind == "cooling":
            self.inject_cooling_failure(fault.gpu, fault.cooling_factor)
        elif fault.kind == "ecc-dbe":
            if not m.ecc:
                raise ValueError(f"kind: {m.key} has no ECC memory")
            g.ecc_uncorrected += 1
            g.remapped_uncorrectable += 1
        elif fault.kind == "xid48":
            if m.ecc:
                g.ecc_uncorrected += 1
            g.pending_xids.append(48)
        elif fault.kind == "xid79":
            g.pending_xids.append(79)
            g.lost_after_report = True
        elif fault.kind == "nvlink-crc":
            if self.interconnect != "nvlink" or m.key not in NVLINK_LINKS:
                raise ValueError(f"kind: {self.node} has no NVLink")
            # Spread the burst over a few samples, front-loaded, as a flapping link does.
            share = [fault.crc_errors // 2] + [fault.crc_errors // (2 * (CRC_BURST_S - 1))] * (CRC_BURST_S - 1)
            share[-1] += fault.crc_errors - sum(share)
            g.crc_burst_left.extend(share)
        elif fault.kind == "vram-leak":
            if g.job is None:
                raise ValueError(f"gpu: no job runs on GPU {fault.gpu} of {self.node}; a leak needs a process")
            g.leak_rate = fault.leak_mib_per_s
        elif fault.kind == "foreign-memory":
            g.foreign_mib = fault.memory_mib
        elif fault.kind == "gpu-vanish":
            g.gone = True
        elif fault.kind == "vram-flip":
            g.flipped_bits = fault.bits
        elif fault.kind == "pcie-degraded":
            g.pcie_width = 4
        else:
            raise ValueError(f"kind: {fault.kind!r} is not a GPU fault")
        return f"{fault.kind} on {self.node} GPU {fault.gpu}"

    def clear(self) -> list[int]:
        """Undo every injected GPU fault (a repaired card: cooling as built, counters at zero, a vanished GPU back);
        return the indices of the GPUs that had one. The temperature falls back through the thermal model."""
        cleared = []
        for g in self._gpus:
            healthy = _Gpu(g.identity, g.model, g.temperature_c, g.energy_j, g.job, g.pid, g.util_pct,
                           nvlink_bytes=g.nvlink_bytes)
            faulted = (g.cooling_factor, g.ecc_corrected, g.ecc_uncorrected, g.remapped_uncorrectable,
                       g.nvlink_crc_errors, g.crc_burst_left, g.leak_rate, g.leak_mib, g.foreign_mib, g.pending_xids,
                       g.lost_after_report, g.gone, g.flipped_bits, g.pcie_width)
            clean: tuple[object, ...] = (healthy.cooling_factor, 0, 0, 0, 0, [], 0.0, 0.0, 0.0, [], False, False, 0,
                                         healthy.pcie_width)
            if faulted != clean:
                cleared.append(g.identity.index)
                self._gpus[g.identity.index] = healthy
        return cleared

    def burn_in_state(self, index: int) -> BurnInState:
        """What a burn-in of GPU `index` meets now."""
        g = self._gpus[index]
        return BurnInState(g.flipped_bits, g.pcie_width, g.gone or g.lost_after_report,
                           g.temperature_c >= self.model.temp_slowdown_c)

    def memory_tested(self, index: int, reads: int) -> None:
        """A memory test read the bad cell `reads` times: ECC counts each read of it (corrected or not)."""
        g = self._gpus[index]
        if g.flipped_bits and self.model.ecc:
            if g.flipped_bits == 1:
                g.ecc_corrected += reads
            else:
                g.ecc_uncorrected += reads

    def resume_at(self, when: datetime) -> None:
        """Go on from `when`: after a burn-in ran the node on its own (virtual) clock, the next sample's interval
        is counted from here, not from the burn-in's last."""
        self._last = when

    def sample(self, now: datetime) -> list[GpuSample]:
        dt = 1.0 if self._last is None else max((now - self._last).total_seconds(), 0.0)
        self._last = now
        return [s for g in self._gpus if (s := self._sample_gpu(g, dt)) is not None]

    def _heat(self, g: _Gpu, util: float, dt: float) -> tuple[float, list[str], float]:
        """Power at this utilization, the temperature it drives, and the throttling and clocks that follow."""
        m = self.model
        power = m.idle_power_w + (m.tdp_w - m.idle_power_w) * util / 100
        if g.temperature_c >= m.temp_slowdown_c:
            power = m.idle_power_w + (power - m.idle_power_w) * THROTTLED_CLOCK  # slower clocks draw less
        target = self._steady(power, g.cooling_factor)
        g.temperature_c += (target - g.temperature_c) * min(dt / TAU_S, 1.0)
        # The hardware slowdown holds a GPU under its shutdown limit (a real one would otherwise power off).
        g.temperature_c = min(g.temperature_c, m.temp_shutdown_c - 1)
        g.energy_j += power * dt
        reasons = []
        if g.temperature_c >= m.temp_slowdown_c:
            reasons += ["sw_thermal_slowdown", "hw_thermal_slowdown"]
        if power >= 0.99 * m.tdp_w:
            reasons.append("sw_power_cap")
        sm_clock = BASE_SM_CLOCK.get(m.key, 1500) * (THROTTLED_CLOCK if "sw_thermal_slowdown" in reasons else 1.0)
        if not g.job and not g.foreign_mib:
            sm_clock = IDLE_SM_CLOCK.get(m.key, 210)
        return power, reasons, sm_clock

    def _memory(self, g: _Gpu, dt: float) -> tuple[float, int, list[GpuProcess]]:
        """Memory used (the job's, a leak's, a foreign process's, the context and the driver's idle use), the
        driver's reserve, and the processes holding it."""
        m = self.model
        job_mib = 0.0
        if g.job:
            job_mib = (0.3 + 0.6 * stable_fraction(g.job)) * m.memory_mib
            g.leak_mib += g.leak_rate * dt
        reserved = round(m.memory_mib * 0.0056)
        context = CONTEXT_MIB if g.job else 0.0
        used = min(job_mib + g.leak_mib + g.foreign_mib + context + IDLE_USED_MIB, m.memory_mib - reserved)
        own_mib = round(max(used - IDLE_USED_MIB - g.foreign_mib, 0.0), 1)
        processes = [GpuProcess(pid=g.pid or 0, used_mib=own_mib, job_id=g.job)] if g.job else []
        if g.foreign_mib:
            processes.append(GpuProcess(pid=FOREIGN_PID, used_mib=round(g.foreign_mib, 1), job_id=None))
        return used, reserved, processes

    def _sample_gpu(self, g: _Gpu, dt: float) -> GpuSample | None:
        if g.gone:
            return None
        m = self.model
        datacenter = m.key in DATACENTER
        util = min(100.0, max(0.0, self._rng.gauss(g.util_pct, 4))) if g.job else 0.0
        power, reasons, sm_clock = self._heat(g, util, dt)
        used, reserved, processes = self._memory(g, dt)

        nvlink = self.interconnect == "nvlink" and m.key in NVLINK_LINKS
        if nvlink:
            g.nvlink_bytes += m.nvlink_gbps * 1e9 * 0.3 * util / 100 * dt
            if g.crc_burst_left:
                g.nvlink_crc_errors += g.crc_burst_left.pop(0)
        pcie_rate = (2e9 + self._rng.uniform(0, 1e9)) * util / 100 + 5e6
        xids, g.pending_xids = g.pending_xids, []
        if g.lost_after_report:
            g.gone = True
        return GpuSample(
            uuid=g.identity.uuid,
            index=g.identity.index,
            model=m.key,
            utilization_gpu_pct=round(util, 1),
            utilization_memory_pct=round(util * 0.6, 1),
            memory_used_mib=round(used, 1),
            memory_total_mib=m.memory_mib,
            memory_free_mib=round(m.memory_mib - reserved - used, 1),
            memory_reserved_mib=reserved,
            temperature_c=round(g.temperature_c, 1),
            memory_temperature_c=round(g.temperature_c + 6, 1) if m.mem_temp_max_c else None,
            slowdown_temperature_c=m.temp_slowdown_c,
            shutdown_temperature_c=m.temp_shutdown_c,
            thermal_margin_c=round(m.temp_slowdown_c - g.temperature_c, 1),
            power_w=round(power, 1),
            power_limit_w=m.tdp_w,
            energy_j=round(g.energy_j, 1),
            sm_clock_mhz=round(sm_clock),
            mem_clock_mhz=MEM_CLOCK.get(m.key),
            throttle_reasons=reasons,
            ecc_corrected=g.ecc_corrected if m.ecc else None,
            ecc_uncorrected=g.ecc_uncorrected if m.ecc else None,
            remapped_rows_correctable=0 if m.ecc else None,
            remapped_rows_uncorrectable=g.remapped_uncorrectable if m.ecc else None,
            row_remap_failure=False if m.ecc else None,
            xid_errors=xids,
            pcie_replay_count=0,
            pcie_tx_bytes_per_s=round(pcie_rate),
            pcie_rx_bytes_per_s=round(pcie_rate * 1.1),
            nvlink_links_active=NVLINK_LINKS[m.key] if nvlink else None,
            nvlink_crc_errors=g.nvlink_crc_errors if nvlink else None,
            nvlink_replay_errors=0 if nvlink else None,
            nvlink_recovery_errors=0 if nvlink else None,
            nvlink_bandwidth_bytes=round(g.nvlink_bytes) if nvlink else None,
            tensor_active=round(util / 100 * 0.55, 3) if datacenter else None,
            **_engines(g.job, util, datacenter),
            processes=processes,
        )


def _engines(job: str | None, util: float, datacenter: bool) -> dict[str, float | None]:
    """Video engines and DCGM's engine ratios. Most jobs encode and decode nothing; about one in five (a video
    data loader, stable per job) keeps the decoder busy in step with its compute, and a card with an encoder
    in use (the RTX 4090; an A100, H100 or H200 has none and NVML reports 0 %) encodes a third of that. The
    graphics engine is active while kernels run (about GPU utilization), DRAM while memory is copied. The
    profiling ratios exist only on the data-centre models (DCGM has none for a GeForce before Blackwell)."""
    video = job is not None and stable_fraction(f"video:{job}") < 0.2
    dec = round(util * (0.2 + 0.3 * stable_fraction(f"dec:{job}")), 1) if video else 0.0
    return {"encoder_util_pct": round(dec / 3, 1) if not datacenter else 0.0, "decoder_util_pct": dec,
            "gr_engine_active": round(util / 100 * 0.97, 3) if datacenter else None,
            "dram_active": round(util / 100 * 0.45, 3) if datacenter else None}
