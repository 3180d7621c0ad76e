"""Simulated GPU backend: deterministic and physically plausible."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import gpu_models, load_fleet

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


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
