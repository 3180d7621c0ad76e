"""The burn-in's whole path on simulated GPUs: plausible figures, and the injected faults it must catch."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from whaleflux.agent.burnin.plan import PlanError, make_plan
from whaleflux.agent.burnin.run import run_burnin
from whaleflux.agent.burnin.simulated import SimulatedExerciser
from whaleflux.agent.faults import Fault
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import gpu_models

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def node(model="H200", gpus=8, interconnect="nvlink", name="h200-01") -> SimulatedNode:
    return SimulatedNode(name, gpu_models()[model], gpus, interconnect=interconnect)


def burn(n: SimulatedNode, **plan):
    return run_burnin(n, SimulatedExerciser(n, T0), make_plan(**({"duration": "10m"} | plan)))


def figures(card, check):
    return next(c for c in card.checks if c.check == check).figures


def test_healthy_h200_node_passes_with_plausible_figures():
    report = burn(node())
    assert report.verdict == "pass" and [c.verdict for c in report.gpus] == ["pass"] * 8
    card = report.gpus[0]
    assert [c.check for c in card.checks] == ["compute", "memory", "bandwidth", "thermal", "health"]
    assert 0.8 * 67 <= figures(card, "compute")["tflops_fp32"] <= 67
    memory = figures(card, "memory")
    assert memory["mismatches"] == 0 and 0.85 < memory["coverage"] < 0.95 and memory["patterns"] == 4
    bandwidth = figures(card, "bandwidth")
    assert 45 < bandwidth["h2d_gbps"] < 63 and 3500 < bandwidth["d2d_gbps"] < 4800
    assert sorted(k for k in bandwidth if k.startswith("peer")) == [f"peer{i}_gbps" for i in range(1, 8)]
    thermal = figures(card, "thermal")
    assert thermal["samples"] == 600 and thermal["max_temperature_c"] < 89 and thermal["mean_power_w"] > 600
    assert report.duration_s == 600 and (report.finished_at - report.started_at).total_seconds() > 600


def test_a_gpu_that_throttles_fails_thermal_and_computes_less():
    n = node()
    n.inject(Fault(kind="cooling", node="h200-01", gpu=2))
    report = burn(n)
    hot = report.gpus[2]
    assert report.verdict == "fail" and hot.verdict == "fail"
    assert [c.verdict for c in report.gpus if c.index != 2] == ["pass"] * 7
    throttled = r"thermal: throttled at 9\d °C \(hw_thermal_slowdown, sw_thermal_slowdown\) in \d+ of 600 samples"
    assert any(re.fullmatch(throttled, r) for r in hot.reasons), hot.reasons
    assert figures(hot, "compute")["tflops_fp32"] < figures(report.gpus[0], "compute")["tflops_fp32"] * 0.8
    assert figures(hot, "thermal")["min_sm_clock_mhz"] < 1980


def test_a_flipped_bit_is_corrected_by_ecc_and_warns_two_bits_fail():
    n = node(gpus=2)
    n.inject(Fault(kind="vram-flip", node="h200-01", gpu=0, bits=1))
    n.inject(Fault(kind="vram-flip", node="h200-01", gpu=1, bits=2))
    one, two = burn(n, checks="memory").gpus
    assert one.verdict == "warn" and one.reasons == ["health: 4 new corrected ECC error(s)"]
    assert figures(one, "memory")["mismatches"] == 0
    assert two.verdict == "fail"
    assert two.reasons[0].startswith("memory: 4 mismatches in ") and "new uncorrectable ECC" in two.reasons[1]


def test_a_flipped_bit_on_a_card_without_ecc_is_a_mismatch():
    n = node("RTX4090", gpus=1, interconnect="pcie", name="r4090-01")
    n.inject(Fault(kind="vram-flip", node="r4090-01", gpu=0))
    [card] = burn(n, checks="memory").gpus
    assert card.verdict == "fail" and figures(card, "memory")["mismatches"] == 4
    assert figures(card, "health")["ecc_corrected_new"] == 0  # no ECC to count it


def test_a_degraded_pcie_link_fails_bandwidth_with_how_far_under():
    n = node(gpus=2)
    n.inject(Fault(kind="pcie-degraded", node="h200-01", gpu=1))
    ok, slow = burn(n, checks="bandwidth").gpus
    assert ok.verdict == "pass" and slow.verdict == "fail"
    assert re.fullmatch(r"bandwidth: host→device 1\d\.\d GB/s, [78]\d% under the PCIe x16 spec of 63", slow.reasons[0])


def test_a_gpu_that_falls_off_the_bus_during_the_run_fails():
    n = node(gpus=2)
    n.inject(Fault(kind="xid79", node="h200-01", gpu=1))
    report = burn(n, duration="30s")
    lost = report.gpus[1]
    assert lost.verdict == "fail"
    assert "health: the GPU stopped answering during the burn-in" in lost.reasons
    assert "health: XID 79 during the run" in lost.reasons
    assert report.gpus[0].verdict == "pass"


def test_only_the_chosen_gpu_and_checks_run():
    n = node(gpus=4)
    uuid = n.identities()[3].uuid
    report = burn(n, gpus=uuid, checks="memory")
    assert [c.index for c in report.gpus] == [3] and [c.check for c in report.gpus[0].checks] == ["memory", "health"]
    assert report.duration_s == 0  # no stress: the GPUs never heated
    assert burn(n, gpus="1", checks="compute").gpus[0].index == 1
    with pytest.raises(PlanError, match=r"--gpu: no GPU '9' on this node; it has 0 \(GPU-"):
        burn(n, gpus="9")


def test_same_node_same_plan_same_report():
    # All but the CPU time the sampling took, which is measured.
    a, b = (burn(node(gpus=2), duration="1m").model_dump(exclude={"sample_cpu_ms_per_gpu"}) for _ in range(2))
    assert a == b


def test_the_fault_model_bounds_flipped_bits():
    with pytest.raises(ValueError, match="bits"):
        Fault(kind="vram-flip", node="n", gpu=0, bits=3)
    with pytest.raises(ValueError, match="gpu"):
        Fault(kind="pcie-degraded", node="n")
