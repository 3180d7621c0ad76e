"""Simulated GPU backend: deterministic and physically plausible."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import gpu_models, load_fleet

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def run(node, seconds):
    out = None
    for s in range(1, seconds + 1):
        out = node.sample(T0 + timedelta(seconds=s))
    return out


def test_same_seed_same_samples():
    a = SimulatedNode("h100-01", gpu_models()["H100"], 8, seed=7)
    b = SimulatedNode("h100-01", gpu_models()["H100"], 8, seed=7)
    uuids = [g.uuid for g in a.identities()][:2]
    a.job_started(uuids, "j")
    b.job_started(uuids, "j")
    assert run(a, 30) == run(b, 30)
    assert [g.uuid for g in a.identities()] == [g.uuid for g in b.identities()]


def test_load_raises_power_and_temperature_and_idle_gpus_stay_cool():
    node = SimulatedNode("a100-01", gpu_models()["A100"], 2)
    node.job_started([node.identities()[0].uuid], "j")
    busy, idle = run(node, 300)
    assert busy.utilization_gpu_pct > 70 and busy.power_w > 300
    assert idle.utilization_gpu_pct == 0 and idle.power_w == gpu_models()["A100"].idle_power_w
    assert busy.temperature_c > idle.temperature_c + 15
    assert busy.temperature_c < gpu_models()["A100"].temp_slowdown_c  # healthy cooling
    assert busy.energy_j > idle.energy_j > 0


def test_cooling_failure_runs_away_past_slowdown_and_throttles():
    model = gpu_models()["H100"]
    node = SimulatedNode("h100-01", model, 1)
    node.job_started([node.identities()[0].uuid], "j")
    node.inject_cooling_failure(0)
    [hot] = run(node, 600)
    assert hot.temperature_c >= model.temp_slowdown_c
    assert "sw_thermal_slowdown" in hot.throttle_reasons and hot.sm_clock_mhz < 1980


def test_consumer_cards_omit_what_they_do_not_support():
    node = SimulatedNode("r4090-01", gpu_models()["RTX4090"], 1)
    [s] = node.sample(T0)
    assert s.ecc_uncorrected is None and s.memory_temperature_c is None


def test_demo_fleet_nodes_are_named_by_group():
    names = [n.name for n in load_fleet().nodes()]
    assert names == ["r4090-01", "a100-01", "h100-01", "h200-01"]


# --------------------------------------------------------------------------- faults

from whaleflux.agent.faults import Fault  # noqa: E402


def _h100(gpus=2, seed=0):
    return SimulatedNode("h100-01", gpu_models()["H100"], gpus, seed=seed, interconnect="nvlink")


def test_ecc_double_bit_error_raises_uncorrected_count_and_remaps_a_row():
    node = _h100()
    node.inject(Fault(kind="ecc-dbe", node="h100-01", gpu=1))
    ok, bad = node.sample(T0)
    assert (ok.ecc_uncorrected, bad.ecc_uncorrected) == (0, 1)
    assert bad.remapped_rows_uncorrectable == 1 and bad.xid_errors == []


def test_xid79_is_reported_once_then_the_gpu_stops_answering():
    node = _h100()
    node.inject(Fault(kind="xid79", node="h100-01", gpu=0))
    first = node.sample(T0)
    assert [s.xid_errors for s in first] == [[79], []]
    assert [s.index for s in node.sample(T0 + timedelta(seconds=1))] == [1]


def test_xid48_is_reported_once_with_the_double_bit_error():
    node = _h100()
    node.inject(Fault(kind="xid48", node="h100-01", gpu=0))
    [a, _] = node.sample(T0)
    [b, _] = node.sample(T0 + timedelta(seconds=1))
    assert a.xid_errors == [48] and b.xid_errors == [] and b.ecc_uncorrected == 1


def test_nvlink_crc_burst_adds_its_errors_over_a_few_samples():
    node = _h100()
    node.inject(Fault(kind="nvlink-crc", node="h100-01", gpu=0, crc_errors=1000))
    counts = [s[0].nvlink_crc_errors for s in (node.sample(T0 + timedelta(seconds=i)) for i in range(8))]
    assert counts[0] == 500 and counts[-1] == 1000 and counts == sorted(counts)


def test_nvlink_fault_on_a_pcie_node_is_refused():
    node = SimulatedNode("r4090-01", gpu_models()["RTX4090"], 1)
    with pytest.raises(ValueError, match="no NVLink"):
        node.inject(Fault(kind="nvlink-crc", node="r4090-01", gpu=0))


def test_vram_leak_grows_the_job_process_until_the_gpu_is_full():
    model = gpu_models()["H100"]
    node = _h100(1)
    node.job_started([node.identities()[0].uuid], "leaky", pid=4242)
    [before] = node.sample(T0)
    node.inject(Fault(kind="vram-leak", node="h100-01", gpu=0, leak_mib_per_s=2048))
    [after10] = node.sample(T0 + timedelta(seconds=10))
    assert after10.memory_used_mib - before.memory_used_mib == pytest.approx(20480, abs=1)
    assert after10.processes[0].job_id == "leaky" and after10.processes[0].pid == 4242
    [full] = run(node, 200)
    assert full.memory_used_mib >= 0.99 * model.memory_mib - full.memory_reserved_mib
    assert full.memory_free_mib == pytest.approx(0, abs=1)


def test_vram_leak_needs_a_job_on_the_gpu():
    with pytest.raises(ValueError, match="no job"):
        _h100().inject(Fault(kind="vram-leak", node="h100-01", gpu=0))


def test_vanished_gpu_leaves_the_samples_and_identities_stay():
    node = _h100()
    node.inject(Fault(kind="gpu-vanish", node="h100-01", gpu=0))
    assert [s.index for s in node.sample(T0)] == [1]
    assert len(node.identities()) == 2


def test_faults_are_deterministic_with_the_same_seed():
    def scenario():
        node = _h100(4, seed=3)
        node.job_started([node.identities()[2].uuid], "j", pid=1)
        out = [node.sample(T0 + timedelta(seconds=1))]
        for f in (Fault(kind="cooling", node="h100-01", gpu=2), Fault(kind="nvlink-crc", node="h100-01", gpu=1),
                  Fault(kind="vram-leak", node="h100-01", gpu=2)):
            node.inject(f)
        out += [node.sample(T0 + timedelta(seconds=s)) for s in range(2, 60)]
        return out

    assert scenario() == scenario()


def test_gpu_faults_need_a_gpu_index():
    with pytest.raises(ValueError, match="gpu"):
        Fault(kind="xid79", node="h100-01")
    assert Fault(kind="node-silent", node="h100-01").gpu is None


def test_racks_differ_in_ambient_so_idle_gpus_differ_in_temperature():
    a = SimulatedNode("a100-01", gpu_models()["A100"], 1, rack="rack1")
    b = SimulatedNode("a100-02", gpu_models()["A100"], 1, rack="rack2")
    assert a.ambient_c is not None and a.ambient_c != b.ambient_c and 22 <= a.ambient_c <= 28
    assert a.sample(T0)[0].temperature_c != b.sample(T0)[0].temperature_c
