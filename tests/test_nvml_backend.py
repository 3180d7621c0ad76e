"""NVML backend against a fake pynvml: what a device supports is reported, what it does not is omitted."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pynvml

from whaleflux.agent.nvml import NvmlBackend, decode_throttle_reasons

from .fake_nvml import FakeDevice, make

NOW = datetime(2026, 12, 1, tzinfo=UTC)
H100 = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
R4090 = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def _fleet():
    return [
        FakeDevice(H100, "NVIDIA H100 80GB HBM3", datacenter=True, total_mib=81559, nvlink_links=18, nvlink_crc=3,
                   decoder=35),
        FakeDevice(R4090, "NVIDIA GeForce RTX 4090", datacenter=False, total_mib=24564),
    ]


def test_datacenter_gpu_reports_everything_it_supports():
    backend = NvmlBackend(make(_fleet()))
    [h100, _] = backend.sample(NOW)
    assert h100.model == "H100" and h100.memory_total_mib == 81559 and h100.memory_reserved_mib == 454
    assert h100.power_w == 300 and h100.power_limit_w == 700 and h100.energy_j == 123456.789
    assert h100.memory_temperature_c == 61 and h100.thermal_margin_c == 34 and h100.slowdown_temperature_c == 89
    assert h100.ecc_uncorrected == 0 and h100.remapped_rows_uncorrectable == 0 and h100.row_remap_failure is False
    assert h100.nvlink_links_active == 18 and h100.nvlink_crc_errors == 3
    assert h100.nvlink_bandwidth_bytes == 18 * 2 * 1000 * 1024
    assert h100.pcie_replay_count == 7 and h100.pcie_tx_bytes_per_s == 1000 * 1024
    assert h100.sm_clock_mhz == 1980 and h100.mem_clock_mhz == 2619
    # dcgm-exporter's default video counters come from NVML; its profiling ratios need DCGM: left out.
    assert (h100.encoder_util_pct, h100.decoder_util_pct) == (0.0, 35.0)
    assert h100.gr_engine_active is None and h100.dram_active is None and h100.tensor_active is None


def test_consumer_card_omits_ecc_nvlink_and_memory_temperature_instead_of_zero():
    fake = make(_fleet())
    backend = NvmlBackend(fake)
    [_, rtx] = backend.sample(NOW)
    for name in ("ecc_uncorrected", "ecc_corrected", "remapped_rows_uncorrectable", "row_remap_failure",
                 "nvlink_links_active", "nvlink_crc_errors", "nvlink_bandwidth_bytes", "memory_temperature_c",
                 "thermal_margin_c"):
        assert getattr(rtx, name) is None, name
    assert rtx.utilization_gpu_pct == 50 and rtx.temperature_c == 55 and rtx.power_w == 300
    assert rtx.encoder_util_pct == 0.0  # a GeForce has encoders: a reading, not None
    ident = {g.uuid: g for g in backend.identities()}[R4090]
    assert ident.serial is None and ident.pci_bus_id == "00000000:28:00.0" and ident.driver_version == "565.57.01"
    # What the card refused once is not asked again.
    fake.calls.clear()
    backend.sample(NOW)
    assert fake.calls.count("nvmlDeviceGetTotalEccErrors") == 2  # the H100's corrected + uncorrected only
    assert fake.calls.count("nvmlDeviceGetRemappedRows") == 1


def test_throttle_reasons_are_decoded_to_names():
    mask = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert decode_throttle_reasons(mask, pynvml) == ["sw_power_cap", "hw_thermal_slowdown"]
    devices = _fleet()
    devices[0].clocks_event_mask = (pynvml.nvmlClocksEventReasonSwThermalSlowdown
                                    | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)
    [h100, _] = NvmlBackend(make(devices)).sample(NOW)
    assert h100.throttle_reasons == ["sw_thermal_slowdown", "hw_power_brake_slowdown"]


def test_xid_events_reach_the_next_sample_of_their_gpu_only():
    fake = make(_fleet())
    backend = NvmlBackend(fake)
    fake.xid_queue += [(1, 79), (0, 48)]  # type: ignore[attr-defined]
    h100, rtx = backend.sample(NOW)
    assert h100.xid_errors == [48] and rtx.xid_errors == [79]
    h100, rtx = backend.sample(NOW)
    assert h100.xid_errors == [] and rtx.xid_errors == []


def test_gpu_fallen_off_the_bus_is_left_out_and_others_keep_reporting():
    devices = _fleet()
    backend = NvmlBackend(make(devices))
    devices[0].lost = True
    samples = backend.sample(NOW)
    assert [s.uuid for s in samples] == [R4090]


def test_processes_are_mapped_to_the_job_whose_session_launched_them():
    devices = _fleet()
    me = os.getpid()
    devices[0].processes = [(me, 2048 * 1024 * 1024), (999999, 1024 * 1024 * 1024)]
    backend = NvmlBackend(make(devices))
    backend.job_started([H100], "job-1", pid=os.getsid(me))
    [h100, _] = backend.sample(NOW)
    assert [(p.pid, p.used_mib, p.job_id) for p in h100.processes] == [(me, 2048, "job-1"), (999999, 1024, None)]
    backend.job_stopped([H100])
    [h100, _] = backend.sample(NOW)
    assert h100.processes[0].job_id is None
