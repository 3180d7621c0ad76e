"""Faults injected into a running simulated agent (CLI -> agent admin endpoint) show up in telemetry and `monitor`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import typer

from whaleflux.agent.faults import FAULT_PARAMS, PARAMETERS, Fault, param_defaults
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.commands.fleet import fault_from_options
from whaleflux.servers import free_port
from whaleflux.shared.catalog import gpu_models

from .processes import ADMIN_TOKEN, Proc, make_cluster, wait_until


def test_injected_faults_reach_telemetry_and_monitor_and_need_the_token(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    telemetry = cluster.service("telemetry", WHALEFLUX_STALE_AFTER_S="1.5")
    port = free_port()
    env = {**cluster.base_env, "WHALEFLUX_INTERVAL_S": "0.2", "WHALEFLUX_HTTP_PORT": str(port)}
    agent = Proc("agent", [sys.executable, "-m", "whaleflux", "agent", "--node", "h100-01", "--node", "r4090-01"],
                 env, cluster.log_dir / "agent.log", port)
    cluster.procs["agent"] = agent.start()
    try:
        telemetry.wait_ready()
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent http")
        gpus = wait_until(lambda: len(r := httpx.get(telemetry.url + "/v1/gpus").json()) == 12 and r, what="12 GPUs")
        assert not any(g["stale"] for g in gpus)

        # Without the admin token: refused.
        body = {"kind": "xid79", "node": "h100-01", "gpu": 3}
        assert httpx.post(agent.url + "/admin/faults", json=body).status_code == 401
        bad = cluster.cli("sim", "inject", "nvlink-crc", "--node", "r4090-01", "--gpu", "0")
        assert bad.returncode == 1 and "no NVLink" in bad.stdout

        for args in (["xid79", "--node", "h100-01", "--gpu", "3"], ["ecc-dbe", "--node", "h100-01", "--gpu", "5"],
                     ["node-silent", "--node", "r4090-01"]):
            done = cluster.cli("sim", "inject", *args)
            assert done.returncode == 0 and "injected:" in done.stdout, done.stdout + done.stderr

        def by_index():
            rows = httpx.get(telemetry.url + "/v1/gpus", params={"node": "h100-01"}).json()
            return {g["gpu"]["index"]: g for g in rows}

        lost = wait_until(lambda: (g := by_index()[3])["stale"] and g, what="XID 79 GPU stale", timeout=60)
        assert lost["last_xid"] == 79 and "xid" in lost["flags"]
        ecc = wait_until(lambda: (g := by_index()[5])["gpu"]["ecc_uncorrected"] == 1 and g, what="DBE counted")
        assert "ecc" in ecc["flags"] and ecc["gpu"]["remapped_rows_uncorrectable"] == 1

        def silent_node_stale() -> bool:
            rows = httpx.get(telemetry.url + "/v1/gpus", params={"node": "r4090-01"}).json()
            return all(g["stale"] for g in rows)

        wait_until(silent_node_stale, what="silent node stale")

        metrics = httpx.get(telemetry.url + "/metrics").text
        assert 'DCGM_FI_DEV_XID_ERRORS{gpu="3"' not in metrics  # the lost GPU's series are gone
        assert 'Hostname="r4090-01"' not in metrics
        assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{" in metrics

        shown = cluster.cli("monitor", "--node", "h100-01")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.count("GPU") >= 8 and "xid 79" in shown.stdout and "ecc" in shown.stdout
        one = cluster.cli("monitor", "--gpu", "5", "--node", "h100-01")
        assert one.stdout.count("GPU5") == 1 and "GPU4" not in one.stdout
    finally:
        cluster.stop()


T0 = datetime(2026, 12, 1, tzinfo=UTC)
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# One value per parameter, other than its default, and the option that sets it.
NON_DEFAULT = {"duration_s": ("--duration", "7"), "leak_mib_per_s": ("--leak-rate", "20"),
               "memory_mib": ("--memory", "12345"), "crc_errors": ("--crc-errors", "1234"),
               "cooling_factor": ("--cooling-factor", "6"), "bits": ("--bits", "2")}


def _cli_fault(kind: str, gpu: int | None = 0, **params: float | int) -> Fault:
    return fault_from_options(kind, "h100-01", gpu, dict(params))


def _h100_busy(gpus: int = 1) -> SimulatedNode:
    node = SimulatedNode("h100-01", gpu_models()["H100"], gpus, seed=0, interconnect="nvlink")
    node.job_started([g.uuid for g in node.identities()], "job-1", pid=4242)
    return node


def test_every_parameter_belongs_to_one_kind_and_has_a_documented_default():
    assert sorted(p for ps in FAULT_PARAMS.values() for p in ps) == sorted(PARAMETERS) == sorted(NON_DEFAULT)
    assert param_defaults("vram-leak") == {"leak_mib_per_s": 1024.0}
    assert param_defaults("node-silent") == {"duration_s": None} and param_defaults("xid79") == {}


@pytest.mark.parametrize("rate", [20.0, 512.0])
def test_the_leak_rate_from_the_cli_is_the_sampled_memory_slope(rate):
    node = _h100_busy()
    [before] = node.sample(T0)
    node.inject(_cli_fault("vram-leak", leak_mib_per_s=rate))
    used = [node.sample(T0 + timedelta(seconds=s))[0].memory_used_mib for s in range(1, 11)]
    slopes = {round(b - a, 3) for a, b in zip([before.memory_used_mib, *used], used, strict=False)}
    assert slopes == {rate}


def test_the_cooling_factor_from_the_cli_sets_how_fast_the_gpu_heats():
    def heating(fault: Fault | None) -> list[float]:
        node = _h100_busy()
        if fault is not None:
            node.inject(fault)
        return [node.sample(T0 + timedelta(seconds=s))[0].temperature_c for s in range(1, 11)]

    plain, by2, by_default, by6 = (heating(None), heating(_cli_fault("cooling", cooling_factor=2.0)),
                                   heating(_cli_fault("cooling")), heating(_cli_fault("cooling", cooling_factor=6.0)))
    # Before throttling holds them all at the slowdown limit, a worse factor is hotter at every sample.
    assert all(a < b < c < d for a, b, c, d in zip(plain[1:], by2[1:], by_default[1:], by6[1:], strict=True))
    assert by_default == heating(Fault(kind="cooling", node="h100-01", gpu=0, cooling_factor=3.0))


@pytest.mark.parametrize(("bits", "corrected", "uncorrected"), [(1, 10, 0), (2, 0, 10)])
def test_the_flipped_bits_from_the_cli_decide_what_ecc_counts(bits, corrected, uncorrected):
    node = _h100_busy()
    node.inject(_cli_fault("vram-flip", bits=bits))
    assert node.burn_in_state(0).flipped_bits == bits
    node.memory_tested(0, reads=10)
    [s] = node.sample(T0)
    assert (s.ecc_corrected, s.ecc_uncorrected) == (corrected, uncorrected)


def test_a_parameter_of_another_kind_or_a_bad_value_is_refused_by_the_model_and_names_the_option():
    for kind, takes in [("vram-leak", "leak_mib_per_s"), ("xid79", None), ("cooling", "cooling_factor")]:
        for name in PARAMETERS:
            if name != takes:
                with pytest.raises(ValueError, match=f"no parameter {name}"):
                    Fault.model_validate({"kind": kind, "node": "n", "gpu": 0, name: 2})
    with pytest.raises(typer.BadParameter, match="no parameter --cooling-factor; it takes --leak-rate") as bad:
        _cli_fault("vram-leak", cooling_factor=4.0)
    assert bad.value.param_hint == "--cooling-factor"
    with pytest.raises(typer.BadParameter, match="only node-silent can end on its own"):
        _cli_fault("cooling", duration_s=5.0)
    with pytest.raises(typer.BadParameter, match="must be above 0") as bad:
        _cli_fault("vram-leak", leak_mib_per_s=-1.0)
    assert bad.value.param_hint == "--leak-rate"
    with pytest.raises(typer.BadParameter, match="takes no GPU"):
        _cli_fault("node-silent", gpu=1)


def test_sim_inject_parameters_reach_a_real_agents_gpus_and_wrong_ones_exit_2(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    telemetry = cluster.service("telemetry", WHALEFLUX_STALE_AFTER_S="1.5")
    port = free_port()
    env = {**cluster.base_env, "WHALEFLUX_INTERVAL_S": "0.2", "WHALEFLUX_HTTP_PORT": str(port)}
    agent = Proc("agent", [sys.executable, "-m", "whaleflux", "agent", "--node", "h100-01"],
                 env, cluster.log_dir / "agent.log", port)
    cluster.procs["agent"] = agent.start()
    try:
        telemetry.wait_ready()
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent http")

        def by_index():
            rows = httpx.get(telemetry.url + "/v1/gpus", params={"node": "h100-01"}).json()
            return {g["gpu"]["index"]: g["gpu"] for g in rows}

        idle = wait_until(lambda: len(r := by_index()) == 8 and r, what="8 GPUs")

        # Every parameter given to a kind it does not belong to: exit 2 naming the option, and the agent refuses it.
        for name, (option, value) in NON_DEFAULT.items():
            kind = "xid48" if name != "duration_s" else "cooling"
            out = cluster.cli("sim", "inject", kind, "--node", "h100-01", "--gpu", "0", option, value)
            assert out.returncode == 2 and option in out.stderr and "no parameter" in out.stderr, out.stderr
            body = {"kind": kind, "node": "h100-01", "gpu": 0, name: float(value)}
            refused = httpx.post(agent.url + "/admin/faults", json=body, headers=AUTH)
            assert refused.status_code == 422 and f"no parameter {name}" in refused.text
        out = cluster.cli("sim", "inject", "nvlink-crc", "--node", "h100-01", "--gpu", "1", "--crc-errors", "0")
        assert out.returncode == 2 and "--crc-errors" in out.stderr and "must be at least 1" in out.stderr

        for args in (["nvlink-crc", "--gpu", "1", "--crc-errors", "1234"],
                     ["foreign-memory", "--gpu", "2", "--memory", "12345"]):
            done = cluster.cli("sim", "inject", args[0], "--node", "h100-01", *args[1:])
            assert done.returncode == 0 and "injected:" in done.stdout, done.stdout + done.stderr
        # The whole burst, and not the default 5000, once it is over; the foreign process's exact size.
        crc = wait_until(lambda: (g := by_index()[1])["nvlink_crc_errors"] == 1234 and g, what="1234 CRC errors")
        assert crc["nvlink_crc_errors"] - idle[1]["nvlink_crc_errors"] == 1234
        held = wait_until(lambda: (g := by_index()[2])["memory_used_mib"] > idle[2]["memory_used_mib"] and g,
                          what="foreign memory")
        assert held["memory_used_mib"] - idle[2]["memory_used_mib"] == pytest.approx(12345, abs=0.5)

        done = cluster.cli("sim", "inject", "node-silent", "--node", "h100-01", "--duration", "1")
        assert done.returncode == 0 and "for 1s" in done.stdout, done.stdout + done.stderr
    finally:
        cluster.stop()


def test_clearing_a_simulated_node_undoes_every_injected_gpu_fault():
    node = _h100_busy(4)
    for fault in (_cli_fault("cooling", 0, cooling_factor=10), _cli_fault("xid79", 1), _cli_fault("ecc-dbe", 2),
                  _cli_fault("foreign-memory", 3), _cli_fault("pcie-degraded", 3)):
        node.inject(fault)
    t = datetime(2026, 3, 1, tzinfo=UTC)
    for i in range(1, 120):
        node.sample(t + timedelta(seconds=i))
    hot = {s.index: s for s in node.sample(t + timedelta(seconds=120))}
    slowdown = hot[0].slowdown_temperature_c
    assert slowdown is not None
    assert 1 not in hot and hot[0].temperature_c >= slowdown and hot[2].ecc_uncorrected == 1
    assert node.clear() == [0, 1, 2, 3]
    assert node.clear() == []  # nothing left to undo
    after = {s.index: s for s in node.sample(t + timedelta(seconds=121))}
    assert sorted(after) == [0, 1, 2, 3] and after[2].ecc_uncorrected == 0
    assert [p.pid for p in after[3].processes] == [4242]  # the job's process runs on; the foreign one is gone
    for i in range(122, 400):
        node.sample(t + timedelta(seconds=i))
    cooled = {s.index: s for s in node.sample(t + timedelta(seconds=400))}
    assert cooled[0].temperature_c < slowdown - 10
