"""Faults injected into a running simulated agent (CLI -> agent admin endpoint) show up in telemetry and `monitor`."""

from __future__ import annotations

import sys

import httpx

from whaleflux.servers import free_port

from .processes import Proc, make_cluster, wait_until


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
