"""Every state a demo creates can be undone, from the CLI and from the console (issue 37, item 3). Real processes on
real NATS and Redis; deadlines only catch a hang.

From the CLI: a node drained and undrained; a cooling fault on one GPU of a running 4-GPU job raises the critical
GPUTemperatureHigh alert, which drains the node and takes that GPU out; `sim clear` ends the fault; an undrain hands
the node back but leaves that GPU cordoned (its alert still fires: idle, it resolves only after its hold) and says
so, and the job is placed again on other GPUs of the node; `--force` hands the GPU back too.
From the console: an operator drains, undrains and clears faults with the node page's buttons; a viewer sees no
buttons and is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from .processes import ADMIN_TOKEN, make_cluster, wait_until
from .test_console_people import csrf_of, log_in
from .test_failover import FAST_FAILOVER, JOB

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NODE = "h100-01"


def _node(scheduler) -> dict:
    return next(n for n in httpx.get(scheduler.url + "/v1/nodes", headers=AUTH).json() if n["node"] == NODE)


def _quarantined(scheduler) -> dict[int, dict]:
    rows = httpx.get(scheduler.url + "/v1/gpus", params={"status": "quarantined"}, headers=AUTH).json()
    return {g["index"]: g for g in rows if g["node"] == NODE}


def _job(scheduler, job_id: str) -> dict:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}", headers=AUTH).json()


def _submit(scheduler, script: Path, gpus: int) -> str:
    body = {"name": "train", "command": [sys.executable, str(script), "100000"], "gpus": gpus,
            "gpu_models": ["H100"], "workload_class": "llm-train"}
    resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]


def _said(done) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())  # one line, whatever the terminal's width


def test_a_cooling_fault_is_undone_from_the_cli_and_the_hot_gpu_stays_out_until_forced(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", **FAST_FAILOVER)
    alerting = cluster.service("alerting", WHALEFLUX_ALERTING_TICK_S="0.1")
    agent = cluster.agent(NODE, interval_s=0.25, name="agent", http=True)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    try:
        scheduler.wait_ready()
        alerting.wait_ready()
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent admin port")
        wait_until(lambda: _node(scheduler)["status"] == "healthy" and _node(scheduler)["heartbeat_age_s"] is not None,
                   what="node heartbeating")

        # An operator's drain and undrain, through the CLI.
        assert f"{NODE} draining (fan swap)" in _said(cluster.cli("nodes", "drain", NODE, "--reason", "fan swap"))
        wait_until(lambda: _node(scheduler)["status"] == "draining", what="node draining")
        listed = _said(cluster.cli("nodes", "list"))
        assert NODE in listed and "draining" in listed and "fan swap" in listed, listed
        assert _said(cluster.cli("nodes", "undrain", NODE)) == f"{NODE} undrained"
        assert _node(scheduler)["status"] == "healthy"
        assert _said(cluster.cli("nodes", "undrain", NODE)) == f"{NODE} was not draining"

        # A running 4-GPU job; one of its GPUs loses its cooling.
        first = _submit(scheduler, script, 4)
        job = wait_until(lambda: (j := _job(scheduler, first))["state"] == "running" and j, what="job running")
        [agent_node] = httpx.get(agent.url + "/v1/nodes", headers=AUTH).json()
        index_of = {g["uuid"]: g["index"] for g in agent_node["gpus"]}
        hot = index_of[job["gpu_uuids"][0]]
        injected = cluster.cli("sim", "inject", "cooling", "--node", NODE, "--gpu", str(hot), "--cooling-factor", "20")
        assert "injected:" in _said(injected)

        # The critical alert takes that GPU out and drains the node; the job is requeued.
        out = wait_until(lambda: _quarantined(scheduler), timeout=60, what="the hot GPU out for its alert")
        assert list(out) == [hot] and out[hot]["cause"] == "alert", out
        assert out[hot]["reason"] == "GPUTemperatureHigh firing"
        wait_until(lambda: _node(scheduler)["status"] == "draining", timeout=60, what="node drained by alerting")
        wait_until(lambda: _job(scheduler, first)["state"] == "pending", timeout=30, what="job requeued")

        # The fault is cleared, on that node and then on all (nothing left).
        assert _said(cluster.cli("sim", "clear", NODE)) == f"{NODE}: cleared GPU {hot}"
        assert _said(cluster.cli("sim", "clear", "--all")) == "no injected faults on any node"
        refused = cluster.cli("sim", "clear")
        assert refused.returncode == 2 and "--all" in refused.stderr

        # The undrain leaves the GPU cordoned and says so; the job goes back to the node, not onto that GPU.
        said = _said(cluster.cli("nodes", "undrain", NODE))
        assert said.startswith(f"{NODE} undrained; GPU {hot} stays cordoned: GPUTemperatureHigh firing"), said
        assert "--force" in said
        job = wait_until(lambda: (j := _job(scheduler, first))["state"] == "running" and j["attempt"] == 2 and j,
                         timeout=60, what="job placed again after the undrain")
        assert hot not in {index_of[u] for u in job["gpu_uuids"]}
        assert list(_quarantined(scheduler)) == [hot]
        firing = [a for a in httpx.get(alerting.url + "/v1/alerts", headers=AUTH).json()
                  if a["rule"] == "GPUTemperatureHigh" and a["labels"]["gpu"] == str(hot)]
        assert firing, "the alert still fires (an idle GPU resolves only after its hold)"

        # Forced, the GPU takes work again.
        said = _said(cluster.cli("nodes", "undrain", NODE, "--force"))
        assert said == f"{NODE} was not draining; GPU {hot} uncordoned (forced)", said
        assert _quarantined(scheduler) == {}
        assert httpx.post(f"{scheduler.url}/v1/jobs/{first}/cancel", headers=AUTH).status_code == 200
    finally:
        cluster.stop()


def test_the_node_page_buttons_drain_undrain_and_clear_faults_for_an_operator_and_not_a_viewer(
        clean_servers, tmp_path, people):
    cluster = make_cluster(clean_servers, tmp_path)
    tokens = {"WHALEFLUX_TOKENS_FILE": people["path"]}
    scheduler = cluster.service("scheduler", **FAST_FAILOVER, **tokens)
    agent = cluster.agent(NODE, interval_s=0.25, name="agent", http=True, **tokens)
    console = cluster.service("console", **tokens, WHALEFLUX_SCHEDULER_URL=scheduler.url,
                              WHALEFLUX_AGENT_URL=agent.url)
    try:
        scheduler.wait_ready()
        console.wait_ready(120)
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent admin port")
        wait_until(lambda: _node(scheduler)["status"] == "healthy", what="node registered")
        olga, _ = log_in(console.url, people["operator"])
        vic, _ = log_in(console.url, people["viewer"])
        page = f"/fleet/nodes/{NODE}"
        shown = wait_until(lambda: (r := olga.get(page)).status_code == 200 and r, what="the node page")
        for button in ("drain-node", "undrain-node", "clear-faults"):
            assert f'data-testid="{button}"' in shown.text
        seen = vic.get(page)
        assert seen.status_code == 200 and "node-actions" not in seen.text
        operator_csrf = {"X-CSRF-Token": csrf_of(shown.text)}
        viewer_csrf = {"X-CSRF-Token": csrf_of(seen.text)}

        # A viewer is refused every action, and nothing changes; without the CSRF token so is an operator.
        for action in ("drain", "undrain", "clear-faults"):
            assert vic.post(f"{page}/{action}", headers=viewer_csrf).status_code == 403
            assert olga.post(f"{page}/{action}").status_code == 403
        assert _node(scheduler)["status"] == "healthy"

        drained = olga.post(f"{page}/drain", data={"reason": "fan swap"}, headers=operator_csrf)
        assert drained.status_code == 200 and f"{NODE} draining (fan swap)" in drained.text, drained.text
        wait_until(lambda: _node(scheduler)["status"] == "draining", what="node drained from the console")

        fault = {"kind": "cooling", "node": NODE, "gpu": 2, "cooling_factor": 5}
        assert httpx.post(agent.url + "/admin/faults", json=fault, headers=AUTH).status_code == 200
        cleared = olga.post(f"{page}/clear-faults", headers=operator_csrf)
        assert cleared.status_code == 200 and f"{NODE}: cleared GPU 2" in cleared.text, cleared.text

        undrained = olga.post(f"{page}/undrain", headers=operator_csrf)
        assert undrained.status_code == 200 and f"{NODE} undrained" in undrained.text, undrained.text
        assert _node(scheduler)["status"] == "healthy"
        again = olga.post(f"{page}/undrain", data={"force": "true"}, headers=operator_csrf)
        assert again.status_code == 200 and f"{NODE} was not draining" in again.text, again.text
    finally:
        cluster.stop()
