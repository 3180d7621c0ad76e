"""A fake `pynvml` module: real pynvml's constants and error classes, devices answered from Python.

A consumer card (RTX 4090) raises NVMLError_NotSupported where a real one
does: ECC counters, remapped rows, NVLink, memory temperature (a field value
with NVML_ERROR_NOT_SUPPORTED), margin temperature.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeDevice:
    uuid: str
    name: str
    datacenter: bool
    total_mib: int
    used_mib: int = 1024
    util: int = 50
    temp: int = 55
    power_mw: int = 300_000
    limit_mw: int = 700_000
    energy_mj: int = 123_456_789
    clocks_event_mask: int = 0
    ecc_dbe: int = 0
    nvlink_links: int = 0
    nvlink_crc: int = 0
    encoder: int = 0  # % (an H100 has no encoder: NVML reports 0)
    decoder: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    lost: bool = False


def _not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def make(devices: list[FakeDevice]) -> types.ModuleType:
    """A module with pynvml's API over `devices`; `module.xid_queue` feeds the event set."""
    mod = types.ModuleType("fake_pynvml")
    for name in dir(pynvml):
        value = getattr(pynvml, name)
        constant = name.startswith(("NVML", "nvmlClocksEventReason", "nvmlEventType", "nvmlMemory_v2"))
        if constant and not callable(value) or (isinstance(value, type) and issubclass(value, Exception)):
            setattr(mod, name, value)
    mod.xid_queue = []  # type: ignore[attr-defined]
    mod.calls = []  # type: ignore[attr-defined]
    handles = {i: d for i, d in enumerate(devices)}

    def dev(h: int) -> FakeDevice:
        d = handles[h]
        if d.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return d

    def dc_only(h: int) -> FakeDevice:
        d = dev(h)
        if not d.datacenter:
            raise _not_supported()
        return d

    def record(fn):
        def wrapper(*args):
            mod.calls.append(fn.__name__)
            return fn(*args)

        wrapper.__name__ = fn.__name__
        return wrapper

    def nvmlInit():
        pass

    def nvmlShutdown():
        pass

    def nvmlSystemGetDriverVersion():
        return "565.57.01"

    def nvmlDeviceGetCount():
        return len(devices)

    def nvmlDeviceGetHandleByIndex(i):
        return i

    def nvmlDeviceGetName(h):
        return dev(h).name

    def nvmlDeviceGetUUID(h):
        return handles[h].uuid

    def nvmlDeviceGetSerial(h):
        return "1650123456789" if dev(h).datacenter else _raise(_not_supported())

    def nvmlDeviceGetVbiosVersion(h):
        return "96.00.99.00.01"

    def nvmlDeviceGetPciInfo(h):
        return types.SimpleNamespace(busId=f"00000000:{0x18 + 0x10 * h:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(h, version=None):
        d = dev(h)
        reserved = 454 * MIB
        ns = types.SimpleNamespace(total=d.total_mib * MIB, used=d.used_mib * MIB,
                                   free=d.total_mib * MIB - d.used_mib * MIB - (reserved if version else 0))
        if version:
            ns.reserved = reserved
        return ns

    def nvmlDeviceGetUtilizationRates(h):
        d = dev(h)
        return types.SimpleNamespace(gpu=d.util, memory=d.util // 2)

    def nvmlDeviceGetTemperature(h, sensor):
        return dev(h).temp

    def nvmlDeviceGetTemperatureThreshold(h, kind):
        dev(h)
        return {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 92}[kind]

    def nvmlDeviceGetMarginTemperature(h):
        d = dc_only(h)
        return 89 - d.temp

    def nvmlDeviceGetPowerUsage(h):
        return dev(h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(h):
        return dev(h).limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(h):
        return dev(h).energy_mj

    def nvmlDeviceGetClockInfo(h, clock):
        dev(h)
        return 1980 if clock == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(h):
        return dev(h).clocks_event_mask

    def nvmlDeviceGetTotalEccErrors(h, kind, counter):
        d = dc_only(h)
        return d.ecc_dbe if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    def nvmlDeviceGetRemappedRows(h):
        d = dc_only(h)
        return (0, d.ecc_dbe, 0, 0)

    def nvmlDeviceGetPcieThroughput(h, counter):
        dev(h)
        return 1000  # KB/s

    def nvmlDeviceGetPcieReplayCounter(h):
        dev(h)
        return 7

    def nvmlDeviceGetNvLinkState(h, link):
        d = dev(h)
        if link >= d.nvlink_links:
            raise _not_supported()
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(h, link, counter):
        d = dev(h)
        crc = (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
        return d.nvlink_crc if (link == 0 and counter == crc[0]) else 0

    def nvmlDeviceGetFieldValues(h, field_ids):
        d = dev(h)
        out = []
        for fid in field_ids:
            fid, scope = fid if isinstance(fid, tuple) else (fid, None)
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                ok = d.datacenter
                value = d.temp + 6
            else:  # NVLink throughput, KiB per link
                ok = d.nvlink_links > 0
                value = 1000
            out.append(types.SimpleNamespace(
                nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                valueType=3, value=types.SimpleNamespace(ullVal=value)))
        return out

    def nvmlDeviceGetEncoderUtilization(h):
        return [dev(h).encoder, 167_000]  # [%, sampling period in us]

    def nvmlDeviceGetDecoderUtilization(h):
        return [dev(h).decoder, 167_000]

    def nvmlDeviceGetComputeRunningProcesses(h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in dev(h).processes]

    def nvmlEventSetCreate():
        return "eventset"

    def nvmlDeviceRegisterEvents(h, kinds, events):
        pass

    def nvmlEventSetWait_v2(events, timeout_ms):
        if not mod.xid_queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        h, xid = mod.xid_queue.pop(0)
        return types.SimpleNamespace(device=h, eventData=xid)

    def nvmlEventSetFree(events):
        pass

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(mod, fn.__name__, record(fn))
    return mod


def _raise(exc: Exception) -> Any:
    raise exc
