"""Failover through real NATS and Redis, a scheduler process and simulated agent processes.

A node that goes silent mid-job (its heartbeats stop, or its agent is killed
with kill -9) is declared lost after the scheduler's lost timeout, and the job
resumes on another node from its checkpoint; the old attempt is stopped, not
run twice.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import httpx

from whaleflux.shared.events import JobPlaced, JobPreempted, JobRequeued

from .processes import ADMIN_TOKEN, make_cluster, wait_until
from .test_crash_recovery import _job_history

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FAST_FAILOVER = {
    "WHALEFLUX_HEARTBEAT_SUSPECT_S": "1.0",
    "WHALEFLUX_HEARTBEAT_LOST_S": "2.5",
    "WHALEFLUX_PREEMPTION_GRACE_S": "2",
    "WHALEFLUX_PASS_INTERVAL_S": "0.3",
}

# Counts steps into its checkpoint; resumes from it when WHALEFLUX_RESUME=1; stops on SIGTERM
# (as a job that saves and exits would) or when the agent that started it dies.
JOB = """
import os, pathlib, signal, sys, time
ck = pathlib.Path(os.environ["WHALEFLUX_CHECKPOINT_DIR"]) / "step"
step = int(ck.read_text()) if os.environ["WHALEFLUX_RESUME"] == "1" and ck.exists() else 0
print(f"attempt={os.environ['WHALEFLUX_ATTEMPT']} resume={os.environ['WHALEFLUX_RESUME']} from={step}", flush=True)
def term(*_):
    print(f"sigterm at {step}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
parent = os.getppid()
while step < int(sys.argv[1]):
    time.sleep(0.1)
    step += 1
    tmp = ck.with_name("step.tmp")
    tmp.write_text(str(step))
    os.replace(tmp, ck)  # atomic, as a real checkpoint: a reader or a resumed attempt never sees half a file
    if os.getppid() != parent:
        print("agent gone", flush=True)
        sys.exit(1)
print(f"done at {step}", flush=True)
"""


def _start(clean_servers, tmp_path: Path, fence_after_s: float = 10.0):
    cluster = make_cluster(clean_servers, tmp_path)
    try:
        # The nodes' self-fence budget is the scheduler's too: it holds a lost node's job that long at least.
        scheduler = cluster.service("scheduler", **FAST_FAILOVER, WHALEFLUX_FENCE_AFTER_S=str(fence_after_s))
        h100 = cluster.agent("h100-01", interval_s=0.3, name="agent-h100", http=True,
                             WHALEFLUX_FENCE_AFTER_S=str(fence_after_s))
        a100 = cluster.agent("a100-01", interval_s=0.3, name="agent-a100", http=True)
        scheduler.wait_ready()

        def both_healthy():
            nodes = httpx.get(scheduler.url + "/v1/nodes").json()
            return len(nodes) == 2 and all(n["status"] == "healthy" and n["heartbeat_age_s"] is not None for n in nodes)

        wait_until(both_healthy, what="both nodes registered and heartbeating")
    except BaseException:
        cluster.stop()  # a start-up that fails leaves no process behind
        raise
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return cluster, scheduler, h100, a100, script


def _submit(scheduler, script: Path, steps: int) -> str:
    body = {"name": "train", "command": [sys.executable, str(script), str(steps)], "gpus": 2,
            "gpu_models": ["H100", "A100"], "workload_class": "llm-train"}
    resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]


def _job(scheduler, job_id: str) -> dict:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}").json()


def _running_on(scheduler, job_id: str, node: str, attempt: int):
    job = _job(scheduler, job_id)
    return job["state"] == "running" and job["node"] == node and job["attempt"] == attempt and job


def _checkpoint(tmp_path: Path, job_id: str) -> int:
    path = tmp_path / "home" / "areas" / job_id / "checkpoints" / "step"
    return int(path.read_text() or 0) if path.exists() else 0


def _assert_moved_once(servers, job_id: str) -> None:
    history = [e for e in asyncio.run(_job_history(servers)) if getattr(e, "job_id", None) == job_id]
    placed = [(e.attempt, e.node) for e in history if isinstance(e, JobPlaced)]
    assert placed == [(1, "h100-01"), (2, "a100-01")]
    [requeued] = [e for e in history if isinstance(e, JobRequeued)]
    assert requeued.cause == "node_lost" and requeued.node == "h100-01" and requeued.attempt == 1
    stops = Counter((e.node, e.attempt) for e in history if isinstance(e, JobPreempted))
    assert stops[("h100-01", 1)] >= 1, "the lost node is told to stop the old attempt"


def test_silent_node_mid_job_is_declared_lost_and_the_job_resumes_on_another_node(clean_servers, tmp_path):
    cluster, scheduler, h100, a100, script = _start(clean_servers, tmp_path)
    try:
        job_id = _submit(scheduler, script, steps=60)
        wait_until(lambda: _running_on(scheduler, job_id, "h100-01", 1), what="running on the H100 node")
        wait_until(lambda: _checkpoint(tmp_path, job_id) >= 5, what="some progress checkpointed")

        # The H100 node stops heartbeating (its agent and the job live on: a partition, not a crash).
        resp = httpx.post(h100.url + "/admin/faults", json={"kind": "node-silent", "node": "h100-01"}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        wait_until(lambda: any(n["status"] == "suspect" for n in httpx.get(scheduler.url + "/v1/nodes").json()),
                   timeout=5, interval=0.05, what="node suspect first")
        wait_until(lambda: _running_on(scheduler, job_id, "a100-01", 2), timeout=60, what="resumed on the A100 node")
        nodes = {n["node"]: n for n in httpx.get(scheduler.url + "/v1/nodes").json()}
        assert nodes["h100-01"]["status"] == "lost" and nodes["a100-01"]["status"] == "healthy"

        # The old attempt was stopped on the silent node (its agent still consumes stop orders).
        log1 = tmp_path / "home" / "jobs" / f"{job_id}.1.log"
        wait_until(lambda: "sigterm at" in log1.read_text(), timeout=30, what="attempt 1 stopped")
        done = wait_until(lambda: _job(scheduler, job_id)["state"] == "succeeded" and _job(scheduler, job_id),
                          timeout=90, what="job succeeded")
        assert done["attempt"] == 2
        log2 = (tmp_path / "home" / "jobs" / f"{job_id}.2.log").read_text()
        resumed_from = int(log2.split("from=")[1].split()[0])
        assert "resume=1" in log2 and resumed_from >= 5, log2
        assert "done at 60" in log2
        _assert_moved_once(clean_servers, job_id)
        why = httpx.get(f"{scheduler.url}/v1/jobs/{job_id}/why").json()["why"]
        assert "requeued: attempt 1 on h100-01: node lost: no heartbeat" in why
    finally:
        cluster.stop()


def test_agent_killed_9_for_good_mid_job_moves_the_job_to_another_node_once_its_supervisor_stopped_it(
        clean_servers, tmp_path):
    cluster, scheduler, h100, a100, script = _start(clean_servers, tmp_path, fence_after_s=1.0)
    try:
        job_id = _submit(scheduler, script, steps=60)
        wait_until(lambda: _running_on(scheduler, job_id, "h100-01", 1), what="running on the H100 node")
        wait_until(lambda: _checkpoint(tmp_path, job_id) >= 3, what="some progress checkpointed")
        h100.kill9()  # and it never comes back
        # The job outlives its agent under its supervisor, which stops it once the agent has been silent
        # for WHALEFLUX_FENCE_AFTER_S: before the scheduler, holding the job that long, places it again.
        log1 = tmp_path / "home" / "jobs" / f"{job_id}.1.log"
        wait_until(lambda: "sigterm at" in log1.read_text(), timeout=30, what="attempt 1 stopped by its supervisor")
        wait_until(lambda: _running_on(scheduler, job_id, "a100-01", 2), timeout=60, what="resumed on the A100 node")
        done = wait_until(lambda: _job(scheduler, job_id)["state"] == "succeeded" and _job(scheduler, job_id),
                          timeout=90, what="job succeeded")
        assert done["node"] == "a100-01"
        assert "resume=1" in (tmp_path / "home" / "jobs" / f"{job_id}.2.log").read_text()
        _assert_moved_once(clean_servers, job_id)
    finally:
        cluster.stop()


def test_a_node_that_registers_and_dies_before_its_first_heartbeat_is_lost_and_its_job_requeued(
        clean_servers, tmp_path):
    from whaleflux.agent.simulated import SimulatedNode
    from whaleflux.shared import subjects
    from whaleflux.shared.catalog import gpu_models
    from whaleflux.shared.events import NodeRegistered

    from .processes import connect_bus

    cluster, scheduler, _, _, script = _start(clean_servers, tmp_path)
    try:
        [site] = {n["cluster"] for n in httpx.get(scheduler.url + "/v1/nodes").json()}
        ghost = SimulatedNode("ghost-01", gpu_models()["H200"], 2, interconnect="nvlink")

        async def register() -> None:  # its agent registers it, then dies before its first heartbeat
            bus = await connect_bus(clean_servers)
            try:
                await bus.publish(subjects.node_registered(site, "ghost-01"), NodeRegistered(
                    cluster=site, node="ghost-01", agent_version="t", gpus=ghost.identities()))
            finally:
                await bus.close()

        asyncio.run(register())
        body = {"name": "only-there", "command": [sys.executable, str(script), "5"], "gpus": 2, "gpu_models": ["H200"]}
        resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["job_id"]
        wait_until(lambda: _job(scheduler, job_id)["attempt"] == 1, timeout=60, what="placed there")
        wait_until(lambda: {n["node"]: n["status"] for n in httpx.get(scheduler.url + "/v1/nodes").json()}
                   .get("ghost-01") == "lost", timeout=60, what="the silent node lost")
        wait_until(lambda: _job(scheduler, job_id)["state"] == "pending", timeout=60, what="the job requeued")
        history = [e for e in asyncio.run(_job_history(clean_servers)) if getattr(e, "job_id", None) == job_id]
        assert [(e.attempt, e.node) for e in history if isinstance(e, JobPlaced)] == [(1, "ghost-01")]
        [requeued] = [e for e in history if isinstance(e, JobRequeued)]
        assert requeued.cause == "node_lost" and requeued.node == "ghost-01"
        nodes = {n["node"]: n["status"] for n in httpx.get(scheduler.url + "/v1/nodes").json()}
        assert nodes == {"h100-01": "healthy", "a100-01": "healthy", "ghost-01": "lost"}
    finally:
        cluster.stop()
