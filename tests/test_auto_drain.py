"""The auto-drain path end to end, with real processes on real NATS and Redis.

A job runs on node A (h100-01). A cooling failure is injected into one of its
GPUs through the simulated agent's admin endpoint; the temperature crosses the
GPU's slowdown limit within a few seconds; the alerting service (shipped rules:
`GPUTemperatureHigh`, `for: 0s`, `actions: [drain]`) raises the alert, pages
the webhook receiver and publishes `node.drain_requested`; the scheduler drains
node A, stops the job there and requeues it; the job resumes from its
checkpoint on node B (a100-01).

This checks what happens and in which order, with deadlines that only catch a
hang; how fast a hot sample pages is measured in bench/alert_latency.py.
"""

from __future__ import annotations

import asyncio

import httpx
import nats
import nats.errors
from redis.asyncio import Redis

from whaleflux.shared import subjects
from whaleflux.shared.events import JobRequeued, NodeDrainRequested, decode

from .processes import ADMIN_TOKEN, make_cluster, wait_until
from .test_alerting_service import Receiver
from .test_crash_recovery import _job_history
from .test_failover import FAST_FAILOVER, JOB, _checkpoint, _running_on, _submit

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _drain_requests(servers) -> list[tuple[str, NodeDrainRequested]]:
    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    try:
        sub = await nc.jetstream().subscribe(subjects.NODE_DRAIN_REQUESTED + ".>", ordered_consumer=True,
                                             deliver_policy=nats.js.api.DeliverPolicy.ALL)
        out: list[tuple[str, NodeDrainRequested]] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:  # no more drain requests stored
                return out
            drain = decode(msg.data)[1]
            assert isinstance(drain, NodeDrainRequested)
            out.append((msg.subject, drain))
    finally:
        await nc.close()


async def _job_class(servers, job_id: str) -> str | None:
    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    try:
        cls = await redis.hget("wf:alerting:job-classes", job_id)
        return cls if isinstance(cls, str) else None
    finally:
        await redis.aclose()


def test_injected_cooling_failure_raises_an_alert_drains_the_node_and_the_job_resumes_elsewhere(clean_servers,
                                                                                              tmp_path):
    hook = Receiver()
    cluster = make_cluster(clean_servers, tmp_path)
    # Shipped rules and routes; the default webhook receiver points at a local server.
    alerting = cluster.service("alerting", WHALEFLUX_ALERTING_WEBHOOK_URLS=hook.url, WHALEFLUX_ALERTING_TICK_S="0.1")
    scheduler = cluster.service("scheduler", **FAST_FAILOVER)
    node_a = cluster.agent("h100-01", interval_s=0.25, name="agent-h100", http=True)
    cluster.agent("a100-01", interval_s=0.25, name="agent-a100", http=True)
    try:
        scheduler.wait_ready()
        alerting.wait_ready()
        wait_until(lambda: httpx.get(node_a.url + "/healthz").status_code == 200, what="agent admin port")

        def both_healthy():
            nodes = httpx.get(scheduler.url + "/v1/nodes").json()
            return len(nodes) == 2 and all(n["status"] == "healthy" and n["heartbeat_age_s"] is not None for n in nodes)

        wait_until(both_healthy, what="both nodes registered and heartbeating")
        script = tmp_path / "job.py"
        script.write_text(JOB)
        job_id = _submit(scheduler, script, steps=200)
        job = wait_until(lambda: _running_on(scheduler, job_id, "h100-01", 1), what="running on node A")
        wait_until(lambda: _checkpoint(tmp_path, job_id) >= 3, what="some progress checkpointed")
        assert httpx.get(alerting.url + "/v1/alerts").json() == []  # a healthy node under load pages nobody
        # Alerting knows the job's workload class (from job.submitted) for its baselines.
        assert wait_until(lambda: asyncio.run(_job_class(clean_servers, job_id)), timeout=30) == "llm-train"

        # The GPU the job runs on loses its cooling (20x the thermal resistance: it runs away within seconds).
        [agent_node] = httpx.get(node_a.url + "/v1/nodes").json()
        index = {g["uuid"]: g["index"] for g in agent_node["gpus"]}[job["gpu_uuids"][0]]
        fault = {"kind": "cooling", "node": "h100-01", "gpu": index, "cooling_factor": 20}
        resp = httpx.post(node_a.url + "/admin/faults", json=fault, headers=AUTH)
        assert resp.status_code == 200, resp.text

        # 1. The alert is raised for that GPU, with the temperature at or above its slowdown limit.
        def hot_alert():
            return next((a for a in httpx.get(alerting.url + "/v1/alerts").json()
                         if a["rule"] == "GPUTemperatureHigh" and a["labels"]["Hostname"] == "h100-01"), None)

        alert = wait_until(hot_alert, timeout=60, interval=0.1, what="GPUTemperatureHigh firing")
        assert alert["labels"]["gpu"] == str(index) and alert["severity"] == "critical"
        assert alert["value"] >= 89  # the H100's slowdown temperature (device-reported)
        page = wait_until(lambda: next((p for p in hook.received if p["status"] == "firing"), None), timeout=30,
                          what="webhook page")
        assert any(a["labels"]["alertname"] == "GPUTemperatureHigh" and a["labels"]["Hostname"] == "h100-01"
                   for a in page["alerts"])

        # 2. node.drain_requested for node A, once, on its node subject.
        drains = wait_until(lambda: asyncio.run(_drain_requests(clean_servers)), timeout=30, what="drain request")
        assert [(s, d.cluster, d.node) for s, d in drains] == [
            ("node.drain_requested.onprem.h100-01", "onprem", "h100-01")]
        assert drains[0][1].reason.startswith("GPUTemperatureHigh:")
        assert drains[0][1].fingerprint == alert["fingerprint"]

        # 3. The scheduler drains node A.
        def drained():
            nodes = {n["node"]: n for n in httpx.get(scheduler.url + "/v1/nodes").json()}
            return nodes["h100-01"]["status"] == "draining" and nodes["h100-01"]
        node = wait_until(drained, timeout=30, what="node A draining")
        assert "GPUTemperatureHigh" in node["reason"]

        # 4. The job resumes on node B from its checkpoint; the attempt on A was stopped.
        wait_until(lambda: _running_on(scheduler, job_id, "a100-01", 2), timeout=60, what="resumed on node B")
        log2 = tmp_path / "home" / "jobs" / f"{job_id}.2.log"
        text = wait_until(lambda: "from=" in (t := log2.read_text()) and t, timeout=30, what="attempt 2 started")
        assert "resume=1" in text and int(text.split("from=")[1].split()[0]) >= 3, text
        log1 = tmp_path / "home" / "jobs" / f"{job_id}.1.log"
        wait_until(lambda: "sigterm at" in log1.read_text(), timeout=30, what="attempt 1 stopped on node A")
        requeued = [e for e in asyncio.run(_job_history(clean_servers))
                    if isinstance(e, JobRequeued) and e.job_id == job_id]
        assert [(e.cause, e.node, e.attempt) for e in requeued] == [("node_drained", "h100-01", 1)]
        why = httpx.get(f"{scheduler.url}/v1/jobs/{job_id}/why").json()["why"]
        assert "requeued: attempt 1 on h100-01: node drained: GPUTemperatureHigh:" in why, why

        incidents = httpx.get(alerting.url + "/v1/incidents").json()
        assert [i["drained_nodes"] for i in incidents if i["drained_nodes"]] == [["onprem/h100-01"]]
    finally:
        cluster.stop()
        hook.close()
