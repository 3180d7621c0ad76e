"""A requeued job on the console, through real processes: a job runs, an operator drains its node, the scheduler
stops and requeues it and places it again elsewhere; the console's jobs list and job page answer 200 and show the
requeue at every step (they answered a bare 500 once a job had been requeued: issue 37)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx

from .processes import ADMIN_TOKEN, Proc, make_cluster, wait_until

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FAST = {"WHALEFLUX_PASS_INTERVAL_S": "0.3", "WHALEFLUX_PREEMPTION_GRACE_S": "2"}
# Runs until told to stop (SIGTERM: it exits as a job that saved its checkpoint would).
JOB = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print("started", flush=True)
while True:
    time.sleep(0.1)
"""


def _login(console: Proc) -> httpx.Client:
    client = httpx.Client(base_url=console.url, timeout=10)
    form = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None, form.text
    done = client.post("/login", data={"token": ADMIN_TOKEN, "csrf": csrf[1], "next": "/jobs"})
    assert done.status_code == 303, done.text
    return client


def _job(scheduler: Proc, job_id: str) -> dict:
    resp = httpx.get(f"{scheduler.url}/v1/jobs/{job_id}", headers=AUTH)
    return resp.json() if resp.status_code == 200 else {}


def _console_shows(client: httpx.Client, job_id: str, line: str, state: str) -> None:
    listed = client.get("/jobs")
    assert listed.status_code == 200, listed.text
    row = re.search(rf'<tr data-job="{re.escape(job_id)}">(.*?)</tr>', listed.text, re.S)
    assert row is not None and "requeued 1×" in row[1], listed.text
    shown = client.get(f"/jobs/{job_id}")
    assert shown.status_code == 200, shown.text
    assert f"<li>{line}</li>" in shown.text and f"requeued: {line}" in shown.text  # the list and `why`
    assert f'data-testid="job-state">{state}</span>' in shown.text


def test_a_job_requeued_off_a_drained_node_shows_on_the_consoles_jobs_list_and_job_page(clean_servers, tmp_path: Path):
    cluster = make_cluster(clean_servers, tmp_path)
    try:
        scheduler = cluster.service("scheduler", **FAST)
        billing = cluster.service("billing")
        cluster.agent("h100-01", "a100-01", interval_s=0.3)
        console = cluster.service("console", WHALEFLUX_SCHEDULER_URL=scheduler.url,
                                  WHALEFLUX_BILLING_URL=billing.url)
        for proc in (scheduler, billing, console):
            proc.wait_ready(60)
        wait_until(lambda: len([n for n in httpx.get(scheduler.url + "/v1/nodes", headers=AUTH).json()
                                if n["status"] == "healthy"]) == 2, what="both nodes registered")
        script = tmp_path / "job.py"
        script.write_text(JOB)
        body = {"name": "long-train", "command": [sys.executable, str(script)], "gpus": 1,
                "gpu_models": ["H100", "A100"]}
        resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["job_id"]
        first = wait_until(lambda: (j := _job(scheduler, job_id)).get("state") == "running" and j,
                           what="the job running")
        node = first["node"]

        drained = httpx.post(f"{scheduler.url}/v1/nodes/{node}/drain", json={"reason": "cooling repair"},
                             headers=AUTH)
        assert drained.status_code == 202, drained.text
        requeued = wait_until(lambda: (j := _job(scheduler, job_id)).get("requeues") and j,
                              what="the job requeued off the drained node")
        [line] = requeued["requeues"]
        assert line == f"attempt 1 on {node}: node drained: cooling repair"

        client = _login(console)
        # Whatever it is doing now (held while its attempt stops, pending, or placed again), the pages answer.
        now = _job(scheduler, job_id)["state"]
        listed, shown = client.get("/jobs"), client.get(f"/jobs/{job_id}")
        assert listed.status_code == 200 and shown.status_code == 200, (listed.text, shown.text)
        assert f"<li>{line}</li>" in shown.text, (now, shown.text)

        again = wait_until(lambda: (j := _job(scheduler, job_id)).get("state") == "running" and j["attempt"] == 2
                           and j, what="the job running again on the other node")
        assert again["node"] != node
        _console_shows(client, job_id, line, "running")
    finally:
        cluster.stop()
