"""The burn-in's pure parts: options, spec lookup in gpu_models.yaml, the report card's judgement, PTX kernels."""

from __future__ import annotations

import re

import pytest

from whaleflux.agent.burnin import ptx
from whaleflux.agent.burnin.card import (
    BandwidthRun,
    ComputeRun,
    Measurements,
    MemoryRun,
    Thresholds,
    judge_bandwidth,
    judge_compute,
    judge_health,
    judge_memory,
    judge_thermal,
    report_card,
)
from whaleflux.agent.burnin.plan import PlanError, make_plan, parse_checks, parse_duration
from whaleflux.agent.burnin.spec import GpuSpec, gpu_spec
from whaleflux.shared.events import GpuSample

GB = 10**9


def sample(**over) -> GpuSample:
    base = dict(uuid="GPU-1", index=0, model="H200", utilization_gpu_pct=100.0, memory_used_mib=1000.0,
                memory_total_mib=143771.0, temperature_c=60.0, slowdown_temperature_c=89.0, power_w=690.0,
                sm_clock_mhz=1980.0, ecc_corrected=0, ecc_uncorrected=0, remapped_rows_uncorrectable=0)
    return GpuSample(**(base | over))


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("5m", 300), ("12h", 43200), ("1h30m", 5400),
                                           ("1d", 86400)])
def test_durations_read_as_people_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "0s", "8d", "5m3"])
def test_a_bad_duration_names_the_option(text):
    with pytest.raises(PlanError, match="--duration"):
        parse_duration(text)


def test_checks_come_back_in_canonical_order_and_unknown_ones_are_named():
    assert parse_checks("thermal,compute") == ("compute", "thermal")
    with pytest.raises(PlanError, match="--checks: vram"):
        parse_checks("compute,vram")


def test_plan_from_the_command_line_words():
    plan = make_plan(gpus="3", duration="12h", intensity="MAX", checks="thermal,memory")
    assert (plan.gpus, plan.duration_s, plan.intensity, plan.checks) == ("3", 43200, "max", ("memory", "thermal"))
    assert plan.stresses and plan.memory_fraction == 0.95
    assert not make_plan(checks="memory,bandwidth").stresses
    with pytest.raises(PlanError, match="--intensity"):
        make_plan(intensity="extreme")


# ------------------------------------------------------------------------------------------ spec


def spec_of(model: str) -> GpuSpec:
    spec = gpu_spec(model)
    assert spec is not None, model
    return spec


def test_spec_lookup_by_key_or_device_name():
    spec = spec_of("NVIDIA H200")
    assert spec == gpu_spec("H200")
    assert spec.fp32_tflops == 67 and spec.memory_bandwidth_gbps == 4800
    assert spec.pcie_gbps == 63.0  # PCIe gen 5 x16, one direction
    assert spec.nvlink_gbps == 450  # the datasheet's 900 GB/s is both directions
    assert spec_of("RTX4090").nvlink_gbps is None and spec_of("RTX4090").pcie_gbps == 31.5
    assert gpu_spec("NVIDIA B300") is None


# ------------------------------------------------------------------------------------------ judgement


def test_compute_under_spec_warns_then_fails_with_the_figures():
    spec, th = spec_of("H200"), Thresholds()
    assert judge_compute(ComputeRun(60e12 * 10, 10), spec, th).verdict == "pass"
    warn = judge_compute(ComputeRun(45e12 * 10, 10), spec, th)
    assert warn.verdict == "warn" and warn.reasons == ["compute: 45.0 TFLOP/s fp32, 33% under the H200's 67"]
    assert judge_compute(ComputeRun(30e12 * 10, 10), spec, th).verdict == "fail"
    assert warn.figures["tflops_fp32"] == 45.0 and warn.figures["of_spec"] == pytest.approx(0.672, abs=1e-3)


def test_memory_mismatches_fail_and_low_coverage_warns():
    th = Thresholds()
    clean = judge_memory(MemoryRun(120 * GB, 150 * GB, 4, 0, 0.4), th)
    assert clean.verdict == "pass" and clean.figures["coverage"] == 0.8 and clean.figures["gbps"] == 2400.0
    bad = judge_memory(MemoryRun(120 * GB, 150 * GB, 4, 3, 0.4, (0x1000,)), th)
    assert bad.verdict == "fail" and bad.reasons == ["memory: 3 mismatches in 120.0 GB tested (at 0x1000)"]
    partial = judge_memory(MemoryRun(30 * GB, 150 * GB, 4, 0, 0.1), th)
    assert partial.verdict == "warn" and "20% of the VRAM" in partial.reasons[0]


def test_bandwidth_under_spec_says_how_far_under():
    spec, th = spec_of("H200"), Thresholds()
    ok = judge_bandwidth(BandwidthRun(52.0, 54.0, 4100.0, {1: 380.0}), spec, th)
    assert ok.verdict == "pass" and ok.figures["peer1_gbps"] == 380.0
    slow = judge_bandwidth(BandwidthRun(31.5, 54.0, 4100.0), spec, th)
    assert slow.verdict == "warn"
    assert slow.reasons == ["bandwidth: host→device 31.5 GB/s, 50% under the PCIe x16 spec of 63"]
    assert judge_bandwidth(BandwidthRun(12.0, 54.0), spec, th).verdict == "fail"
    # Peers over PCIe are held to the PCIe figure, not NVLink's.
    assert judge_bandwidth(BandwidthRun(52.0, 54.0, peer_gbps={1: 40.0}, peer_link="pcie"), spec, th).verdict == "pass"


def test_thermal_throttling_fails_with_the_temperature_and_a_hot_run_warns():
    spec, th = spec_of("H200"), Thresholds()
    cool = [sample(temperature_c=70.0, throttle_reasons=["sw_power_cap"]) for _ in range(5)]
    check = judge_thermal(cool, spec, th)
    # The power cap is normal under stress.
    assert check.verdict == "pass" and check.figures["power_capped_samples"] == 5
    hot = cool + [sample(temperature_c=91.0, sm_clock_mhz=1188.0, throttle_reasons=["sw_thermal_slowdown"])]
    check = judge_thermal(hot, spec, th)
    assert check.verdict == "fail"
    assert check.reasons == ["thermal: throttled at 91 °C (sw_thermal_slowdown) in 1 of 6 samples"]
    assert check.figures["min_sm_clock_mhz"] == 1188.0 and check.figures["max_temperature_c"] == 91.0
    warm = judge_thermal(cool + [sample(temperature_c=87.0)], spec, th)
    assert warm.verdict == "warn" and "within 3 °C of slowdown at 89" in warm.reasons[0]


def test_health_counts_only_what_changed_during_the_run():
    m = Measurements(before=sample(ecc_corrected=5, ecc_uncorrected=1),
                     after=sample(ecc_corrected=5, ecc_uncorrected=1))
    assert judge_health(m).verdict == "pass"  # errors from before the run are not this run's
    m.after = sample(ecc_corrected=7, ecc_uncorrected=1)
    check = judge_health(m)
    assert check.verdict == "warn" and check.reasons == ["health: 2 new corrected ECC error(s)"]
    m.after = sample(ecc_corrected=5, ecc_uncorrected=3)
    assert judge_health(m).reasons == ["health: 2 new uncorrectable ECC error(s)"]
    m = Measurements(before=sample(), during=[sample(xid_errors=[79])], after=None)
    check = judge_health(m)
    assert check.verdict == "fail"
    assert check.reasons == ["health: the GPU stopped answering during the burn-in", "health: XID 79 during the run"]


def test_the_card_is_as_bad_as_its_worst_check_and_lists_every_reason():
    m = Measurements(compute=ComputeRun(45e12, 1), memory=MemoryRun(100 * GB, 150 * GB, 4, 2, 1.0), before=sample(),
                     during=[sample()], after=sample(), thermal=True)
    card = report_card("GPU-1", 0, "H200", m, spec_of("H200"))
    assert card.verdict == "fail"
    assert [c.check for c in card.checks] == ["compute", "memory", "thermal", "health"]
    assert card.reasons == ["compute: 45.0 TFLOP/s fp32, 33% under the H200's 67",
                            "memory: 2 mismatches in 100.0 GB tested"]
    # A model with no spec is measured, never judged against a guess.
    unknown = report_card("GPU-2", 1, "B300", Measurements(compute=ComputeRun(1e12, 1), after=sample()), None)
    assert unknown.verdict == "pass" and "spec_tflops_fp32" not in unknown.checks[0].figures


# ------------------------------------------------------------------------------------------ kernels


def test_ptx_module_declares_the_three_kernels_for_any_gpu_since_volta():
    text = ptx.module()
    assert text.startswith(".version 7.0\n.target sm_70\n.address_size 64\n")
    assert re.findall(r"\.visible \.entry (\w+)\(", text) == ["wf_fma", "wf_mem_write", "wf_mem_verify"]
    # Braces balance, and every register used is declared.
    assert text.count("{") == text.count("}")
    fma = ptx.fma_kernel()
    assert fma.count("fma.rn.f32") == ptx.UNROLL * ptx.ACCUMULATORS
    assert ptx.flops_per_thread(10) == 10 * ptx.UNROLL * ptx.ACCUMULATORS * 2


def test_ptx_registers_are_declared_before_use():
    for kernel in (ptx.fma_kernel(), ptx.memory_kernels()):
        for body in kernel.split(".visible .entry")[1:]:
            declared: dict[str, int | None] = {}
            for _kind, name, count in re.findall(r"\.reg \.(\w+) %(\w+?)(?:<(\d+)>)?;", body):
                declared[name] = int(count) if count else None
            for name, number in re.findall(r"%([a-z]+)(\d*)\b", body.split("}")[0]):
                if name in ("ctaid", "ntid", "tid", "nctaid"):
                    continue
                assert name + number in declared or name in declared, f"%{name}{number} not declared"
                bound = declared.get(name)
                if number and bound is not None:
                    assert int(number) < bound, f"%{name}{number} beyond %{name}<{bound}>"


def test_memory_patterns_cover_address_in_address_and_its_inverse():
    names = [p[0] for p in ptx.PATTERNS]
    assert names == ["address", "inverse address", "0x55", "0xaa"]
    address, inverse = ptx.PATTERNS[0], ptx.PATTERNS[1]
    word = 0x7F00_0000_1238
    assert (word & address[1]) ^ address[2] == word and (word & inverse[1]) ^ inverse[2] == ~word & ptx.ALL_ONES
