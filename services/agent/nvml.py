"""The NVML backend of the agent: real GPUs through nvidia-ml-py (`pynvml`).

Every metric is read on its own: a device that does not support one (an RTX
4090 has no ECC, NVLink or memory temperature sensor) answers
NVMLError_NotSupported, and that metric is left out (None), never reported as
0. What a device refused once is not asked again. A GPU that has fallen off the
bus (NVMLError_GpuIsLost) is left out of the sample.

XID events come from an NVML event set that `sample()` drains without waiting.
Processes are mapped to WhaleFlux jobs by the PIDs the agent launched: a job's
command runs in its own session, so any process of that session counts. (In a
container with its own PID namespace NVML reports host PIDs and the mapping
finds nothing.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any

import structlog

from whaleflux.shared.catalog import model_key
from whaleflux.shared.events import GpuIdentity, GpuProcess, GpuSample

log = structlog.get_logger("whaleflux.agent.nvml")

MIB = 1024 * 1024


def _throttle_bits(nvml: ModuleType) -> list[tuple[int, str]]:
    return [
        (nvml.nvmlClocksEventReasonSwPowerCap, "sw_power_cap"),
        (nvml.nvmlClocksEventReasonHwSlowdown, "hw_slowdown"),
        (nvml.nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"),
        (nvml.nvmlClocksEventReasonHwThermalSlowdown, "hw_thermal_slowdown"),
        (nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"),
    ]


def decode_throttle_reasons(mask: int, nvml: ModuleType) -> list[str]:
    """Names of the clock-event (throttle) reasons set in `mask`."""
    return [name for bit, name in _throttle_bits(nvml) if mask & bit]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    handle: Any
    identity: GpuIdentity
    unsupported: set[str] = field(default_factory=set)
    nvlinks: list[int] = field(default_factory=list)
    lost: bool = False


class NvmlBackend:
    """GpuBackend over NVML. Pass `nvml` to use another module with pynvml's API (tests)."""

    def __init__(self, nvml: ModuleType | None = None):
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml: ModuleType = nvml
        nvml.nvmlInit()
        self._jobs_by_pid: dict[int, str] = {}
        self._jobs_by_uuid: dict[str, str] = {}
        driver = self._maybe(None, "driver", nvml.nvmlSystemGetDriverVersion)
        self._devices: list[_Device] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            dev = _Device(handle, None)  # type: ignore[arg-type]
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            pci = self._maybe(dev, "pci", nvml.nvmlDeviceGetPciInfo, handle)
            dev.identity = GpuIdentity(
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                index=index,
                model=model_key(name) or name,
                name=name,
                serial=_opt_text(self._maybe(dev, "serial", nvml.nvmlDeviceGetSerial, handle)),
                memory_total_mib=memory.total / MIB,
                pci_bus_id=_text(pci.busId) if pci is not None else None,
                driver_version=_opt_text(driver),
                vbios_version=_opt_text(self._maybe(dev, "vbios", nvml.nvmlDeviceGetVbiosVersion, handle)),
            )
            dev.nvlinks = self._active_links(dev)
            self._devices.append(dev)
        self._events = self._xid_event_set()

    # ----------------------------------------------------------------- NVML plumbing

    def _maybe(self, dev: _Device | None, metric: str, fn: Callable, *args: Any) -> Any:
        """Call fn; None if the device does not support it (remembered per device)."""
        nvml = self.nvml
        if dev is not None and metric in dev.unsupported:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission, nvml.NVMLError_FunctionNotFound):
            if dev is not None:
                dev.unsupported.add(metric)
            return None
        except nvml.NVMLError as exc:
            # Transient trouble (e.g. Unknown): leave it out of this sample only.
            log.warning("nvml.read_failed", metric=metric, error=str(exc))
            return None

    def _field(self, dev: _Device, metric: str, field_id: int, scope: int | None = None) -> float | None:
        """One NVML field value, or None when the device does not report it."""
        wanted = [(field_id, scope) if scope is not None else field_id]
        values = self._maybe(dev, metric, self.nvml.nvmlDeviceGetFieldValues, dev.handle, wanted)
        if values is None:
            return None
        v = values[0]
        if v.nvmlReturn != self.nvml.NVML_SUCCESS:
            if v.nvmlReturn == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3) and scope is None:
                dev.unsupported.add(metric)
            return None
        kind = {0: "dval", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(v.valueType, "ullVal")
        return float(getattr(v.value, kind))

    def _active_links(self, dev: _Device) -> list[int]:
        nvml = self.nvml
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = self._maybe(dev, "nvlink", nvml.nvmlDeviceGetNvLinkState, dev.handle, link)
            if state is None:
                if link == 0:
                    break  # no NVLink at all
                continue
            if state == nvml.NVML_FEATURE_ENABLED:
                links.append(link)
        dev.unsupported.discard("nvlink")  # "not supported" on an unused link index says nothing of the others
        return links

    def _xid_event_set(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("nvml.no_event_set", error=str(exc))
            return None
        for dev in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(dev.handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as exc:
                log.info("nvml.no_xid_events", gpu=dev.identity.index, error=str(exc))
        return events

    def _drain_xids(self) -> dict[str, list[int]]:
        """XIDs that arrived since the last sample, by GPU UUID (never blocks)."""
        nvml = self.nvml
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        for _ in range(256):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as exc:
                log.warning("nvml.event_wait_failed", error=str(exc))
                break
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            out.setdefault(uuid, []).append(int(event.eventData))
        return out

    # ----------------------------------------------------------------- GpuBackend

    def identities(self) -> list[GpuIdentity]:
        return [d.identity for d in self._devices]

    def job_started(self, gpu_uuids: list[str], job_id: str, pid: int | None = None) -> None:
        if pid is not None:
            self._jobs_by_pid[pid] = job_id
        for uuid in gpu_uuids:
            self._jobs_by_uuid[uuid] = job_id

    def job_stopped(self, gpu_uuids: list[str]) -> None:
        gone = {self._jobs_by_uuid.pop(u, None) for u in gpu_uuids}
        self._jobs_by_pid = {p: j for p, j in self._jobs_by_pid.items() if j not in gone}

    def _job_of(self, pid: int) -> str | None:
        job = self._jobs_by_pid.get(pid)
        if job is None:
            try:
                job = self._jobs_by_pid.get(os.getsid(pid))
            except OSError:
                job = None
        return job

    def sample(self, now: datetime) -> list[GpuSample]:
        xids = self._drain_xids()
        out = []
        for dev in self._devices:
            if dev.lost:
                continue
            try:
                out.append(self._sample_device(dev, xids.get(dev.identity.uuid, [])))
            except self.nvml.NVMLError_GpuIsLost:
                dev.lost = True
                log.error("nvml.gpu_lost", gpu=dev.identity.index, uuid=dev.identity.uuid)
        return out

    def _sample_device(self, dev: _Device, xids: list[int]) -> GpuSample:
        nvml, h, m = self.nvml, dev.handle, self._maybe
        util = m(dev, "util", nvml.nvmlDeviceGetUtilizationRates, h)
        mem = m(dev, "memory_v2", nvml.nvmlDeviceGetMemoryInfo, h, nvml.nvmlMemory_v2)
        reserved = mem.reserved / MIB if mem is not None else None
        if mem is None:
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
        temp = nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
        threshold = nvml.nvmlDeviceGetTemperatureThreshold
        slowdown = m(dev, "slowdown", threshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shutdown = m(dev, "shutdown", threshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        margin = m(dev, "margin", nvml.nvmlDeviceGetMarginTemperature, h)
        power = m(dev, "power", nvml.nvmlDeviceGetPowerUsage, h)
        limit = m(dev, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        energy = m(dev, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, h)
        events = m(dev, "clock_events", nvml.nvmlDeviceGetCurrentClocksEventReasons, h)
        remap = m(dev, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        pcie_tx = m(dev, "pcie_tx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES)
        pcie_rx = m(dev, "pcie_rx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES)
        ecc = self._ecc(dev)
        nvlink = self._nvlink(dev)
        procs = m(dev, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        return GpuSample(
            uuid=dev.identity.uuid,
            index=dev.identity.index,
            model=dev.identity.model,
            utilization_gpu_pct=float(util.gpu) if util is not None else 0.0,
            utilization_memory_pct=float(util.memory) if util is not None else None,
            memory_used_mib=mem.used / MIB,
            memory_total_mib=mem.total / MIB,
            memory_free_mib=mem.free / MIB,
            memory_reserved_mib=reserved,
            temperature_c=float(temp),
            memory_temperature_c=self._field(dev, "memory_temp", nvml.NVML_FI_DEV_MEMORY_TEMP),
            slowdown_temperature_c=_opt_float(slowdown),
            shutdown_temperature_c=_opt_float(shutdown),
            thermal_margin_c=_opt_float(margin),
            power_w=power / 1000 if power is not None else None,
            power_limit_w=limit / 1000 if limit is not None else None,
            energy_j=energy / 1000 if energy is not None else None,
            sm_clock_mhz=_opt_float(m(dev, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)),
            mem_clock_mhz=_opt_float(m(dev, "mem_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)),
            throttle_reasons=decode_throttle_reasons(events, nvml) if events is not None else [],
            ecc_corrected=ecc["corrected"],
            ecc_uncorrected=ecc["uncorrected"],
            remapped_rows_correctable=remap[0] if remap is not None else None,
            remapped_rows_uncorrectable=remap[1] if remap is not None else None,
            row_remap_failure=bool(remap[3]) if remap is not None else None,
            xid_errors=xids,
            pcie_replay_count=m(dev, "pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter, h),
            pcie_tx_bytes_per_s=pcie_tx * 1024.0 if pcie_tx is not None else None,
            pcie_rx_bytes_per_s=pcie_rx * 1024.0 if pcie_rx is not None else None,
            **nvlink,
            **self._video(dev),
            processes=[
                GpuProcess(pid=p.pid, used_mib=(p.usedGpuMemory or 0) / MIB, job_id=self._job_of(p.pid)) for p in procs
            ],
        )

    def _ecc(self, dev: _Device) -> dict[str, int | None]:
        """Volatile ECC error counts, corrected and uncorrected (None where the GPU has no ECC)."""
        nvml, m = self.nvml, self._maybe
        return {
            kind: m(dev, f"ecc_{kind}", nvml.nvmlDeviceGetTotalEccErrors, dev.handle, err, nvml.NVML_VOLATILE_ECC)
            for kind, err in (("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                              ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        }

    def _video(self, dev: _Device) -> dict[str, float | None]:
        """Encoder and decoder utilization, NVML's averages (DCGM_FI_DEV_ENC_UTIL / DEC_UTIL)."""
        out: dict[str, float | None] = {}
        for name, fn in (("encoder_util_pct", self.nvml.nvmlDeviceGetEncoderUtilization),
                         ("decoder_util_pct", self.nvml.nvmlDeviceGetDecoderUtilization)):
            reading = self._maybe(dev, name, fn, dev.handle)  # [utilization %, its sampling period in us]
            out[name] = float(reading[0]) if reading is not None else None
        return out

    def _nvlink(self, dev: _Device) -> dict:
        """Link count, error counters and bytes over the active links; empty without NVLink."""
        if not dev.nvlinks:
            return {}
        nvml, h = self.nvml, dev.handle
        totals: dict[str, int | None] = {}
        for name, counters in (
            ("nvlink_crc_errors", (nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA)),
            ("nvlink_replay_errors", (nvml.NVML_NVLINK_ERROR_DL_REPLAY,)),
            ("nvlink_recovery_errors", (nvml.NVML_NVLINK_ERROR_DL_RECOVERY,)),
        ):
            values = [
                self._maybe(dev, f"{name}:{c}", nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, c)
                for link in dev.nvlinks for c in counters
            ]
            totals[name] = sum(v for v in values if v is not None) if any(v is not None for v in values) else None
        kib = [
            self._field(dev, f"nvlink_bw:{f}", f, link)
            for link in dev.nvlinks
            for f in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
        ]
        bandwidth = sum(v for v in kib if v is not None) * 1024 if any(v is not None for v in kib) else None
        return {"nvlink_links_active": len(dev.nvlinks), "nvlink_bandwidth_bytes": bandwidth, **totals}

    def close(self) -> None:
        """Release the event set and NVML."""
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
