"""GPU quarantine end to end, with real processes on real NATS and Redis (issue 16, defect 2).

A job runs on two GPUs of node h100-01; one of them reports XID 79 (fallen off the bus) through the simulated
agent's admin endpoint. The scheduler quarantines that GPU at once; alerting drains the node (GPUXidDrain) and
the job is requeued. An operator undrains the node (node.undrained: alerting's incident forgets its drain): the
job goes back to the node, never onto the quarantined GPU, and `jobs why` of a job that needs the whole node
names it. An operator's cordon through the CLI keeps a GPU out until the CLI uncordons it; inventory counts both
as unhealthy. A lost scheduler store is rebuilt with the quarantine, the cordon and the undrain as they were.
Deadlines only catch a hang.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import nats
import nats.errors

from whaleflux.shared import subjects
from whaleflux.shared.events import GpuCordoned, GpuUncordoned, NodeUndrained, decode

from .processes import ADMIN_TOKEN, make_cluster, wait_until
from .test_crash_recovery import _drop_keys
from .test_failover import FAST_FAILOVER, JOB

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NODE = "h100-01"


async def _stored(servers, subject: str) -> list:
    """Every event stored on `subject` (a wildcard), decoded."""
    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    try:
        sub = await nc.jetstream().subscribe(subject, ordered_consumer=True,
                                             deliver_policy=nats.js.api.DeliverPolicy.ALL)
        out: list[object] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:  # nothing more stored
                return out
            out.append(decode(msg.data)[1])
    finally:
        await nc.close()


def _submit(scheduler, script: Path, gpus: int, name: str) -> str:
    body = {"name": name, "command": [sys.executable, str(script), "100000"], "gpus": gpus, "gpu_models": ["H100"],
            "workload_class": "llm-train"}
    resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]


def _job(scheduler, job_id: str) -> dict:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}").json()


def _quarantined(scheduler) -> dict[int, dict]:
    rows = httpx.get(scheduler.url + "/v1/gpus", params={"status": "quarantined"}).json()
    return {g["index"]: g for g in rows if g["node"] == NODE}


def _h100_counts(inventory) -> dict:
    rows = httpx.get(inventory.url + "/v1/inventory", params={"by": "model"}).json()
    return next((r for r in rows if r["key"] == "H100"), {})


def test_a_gpu_with_xid_79_or_cordoned_is_never_handed_out_even_after_an_undrain(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", **FAST_FAILOVER)
    alerting = cluster.service("alerting", WHALEFLUX_ALERTING_TICK_S="0.1")
    inventory = cluster.service("inventory")
    agent = cluster.agent(NODE, interval_s=0.25, name="agent-h100", http=True)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    try:
        scheduler.wait_ready()
        alerting.wait_ready()
        inventory.wait_ready()
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent admin port")
        wait_until(lambda: [n for n in httpx.get(scheduler.url + "/v1/nodes").json()
                            if n["status"] == "healthy" and n["heartbeat_age_s"] is not None], what="node heartbeating")
        [agent_node] = httpx.get(agent.url + "/v1/nodes").json()
        index_of = {g["uuid"]: g["index"] for g in agent_node["gpus"]}

        first = _submit(scheduler, script, 2, "train")
        job = wait_until(lambda: (j := _job(scheduler, first))["state"] == "running" and j, what="job running")
        bad = index_of[job["gpu_uuids"][0]]

        # XID 79 on one of the job's GPUs: quarantined at once, and the node drained by alerting.
        fault = {"kind": "xid79", "node": NODE, "gpu": bad}
        resp = httpx.post(agent.url + "/admin/faults", json=fault, headers=AUTH)
        assert resp.status_code == 200, resp.text
        out = wait_until(lambda: _quarantined(scheduler), what="the GPU quarantined")
        assert list(out) == [bad] and out[bad]["cause"] == "xid" and "XID 79" in out[bad]["reason"]

        def node():
            return next(n for n in httpx.get(scheduler.url + "/v1/nodes").json() if n["node"] == NODE)

        wait_until(lambda: node()["status"] == "draining", timeout=60, what="node drained by alerting")
        wait_until(lambda: _job(scheduler, first)["state"] == "pending", timeout=30, what="job requeued")
        wait_until(lambda: any(i["drained_nodes"] for i in httpx.get(alerting.url + "/v1/incidents").json()),
                   what="the incident's drain recorded")

        # The operator undrains the node: node.undrained goes out, the incident forgets its drain there.
        resp = httpx.post(f"{scheduler.url}/v1/nodes/{NODE}/undrain", headers=AUTH)
        assert resp.status_code == 200 and resp.json()["undrained"] is True, resp.text
        undrains = wait_until(lambda: asyncio.run(_stored(clean_servers, subjects.NODE_UNDRAINED + ".>")),
                              what="node.undrained stored")
        assert [(u.cluster, u.node) for u in undrains if isinstance(u, NodeUndrained)] == [("onprem", NODE)]
        wait_until(lambda: not any(i["drained_nodes"] for i in httpx.get(alerting.url + "/v1/incidents").json()),
                   what="alerting forgot the drain")
        assert node()["quarantined"] == [bad]

        # The job goes back to the node, never onto the quarantined GPU.
        job = wait_until(lambda: (j := _job(scheduler, first))["state"] == "running" and j["attempt"] == 2 and j,
                         timeout=60, what="job placed again after the undrain")
        assert bad not in {index_of[u] for u in job["gpu_uuids"]}

        # A job that needs the whole node waits, and says which GPU is out and why.
        whole = _submit(scheduler, script, 8, "whole-node")
        why = wait_until(lambda: "quarantined:" in (w := httpx.get(f"{scheduler.url}/v1/jobs/{whole}/why").json()
                                                     ["why"]) and w, what="why names the quarantine")
        assert f"quarantined: {NODE} GPU {bad} (xid: XID 79" in why, why
        assert _job(scheduler, whole)["state"] == "pending"
        assert httpx.post(f"{scheduler.url}/v1/jobs/{whole}/cancel", headers=AUTH).status_code == 200

        # An operator's cordon through the CLI: the GPU is not used until the CLI uncordons it.
        used = {index_of[u] for u in job["gpu_uuids"]}
        spare = min(set(range(8)) - used - {bad})
        done = cluster.cli("gpus", "cordon", NODE, str(spare), "--reason", "fan noise")
        assert done.returncode == 0 and f"{NODE} GPU {spare}: cordoned (fan noise)" in done.stdout, done.stderr
        listed = cluster.cli("gpus", "list", "--status", "quarantined")
        assert listed.returncode == 0 and "fan noise" in listed.stdout and "XID 79" in listed.stdout, listed.stderr
        rest = _submit(scheduler, script, 5, "rest")  # 8 - 2 held - 2 out = 4 usable: it waits
        why = wait_until(lambda: "fan noise" in (w := httpx.get(f"{scheduler.url}/v1/jobs/{rest}/why").json()["why"])
                         and w, what="why names the cordon")
        assert f"{NODE} GPU {spare} (operator: fan noise" in why and _job(scheduler, rest)["state"] == "pending"
        counts = wait_until(lambda: (c := _h100_counts(inventory)).get("unhealthy") == 2 and c,
                            what="inventory counts both unhealthy")
        assert counts["active"] == 6 and counts["gpus"] == 8

        done = cluster.cli("gpus", "uncordon", NODE, str(spare))
        assert done.returncode == 0 and "uncordoned (was operator)" in done.stdout, done.stderr
        placed = wait_until(lambda: (j := _job(scheduler, rest))["state"] == "running" and j, timeout=60,
                            what="the waiting job placed on the uncordoned GPU")
        got = {index_of[u] for u in placed["gpu_uuids"]}
        assert spare in got and bad not in got
        wait_until(lambda: _h100_counts(inventory).get("unhealthy") == 1, what="inventory counts one unhealthy")

        # Cordoned again, then the scheduler's store is lost: the rebuild keeps the quarantine, the cordon and
        # the undrain.
        resp = httpx.post(f"{scheduler.url}/v1/nodes/{NODE}/gpus/{spare}/cordon", json={"reason": "RMA"},
                          headers=AUTH)
        assert resp.status_code == 200 and resp.json()["cause"] == "operator", resp.text
        scheduler.stop()
        assert asyncio.run(_drop_keys(clean_servers, "wf:scheduler:*")) > 0
        scheduler.start().wait_ready()
        out = wait_until(lambda: len(q := _quarantined(scheduler)) == 2 and q, what="quarantine rebuilt")
        assert (out[bad]["cause"], out[spare]["cause"], out[spare]["reason"]) == ("xid", "operator", "RMA")
        assert node()["status"] == "healthy" and node()["quarantined"] == sorted([bad, spare])

        # Each change was announced once (inventory counted from these).
        cordons = asyncio.run(_stored(clean_servers, subjects.GPU_CORDONED + ".>"))
        assert [(e.gpu_index, e.cause) for e in cordons if isinstance(e, GpuCordoned)] == [
            (bad, "xid"), (spare, "operator"), (spare, "operator")]
        uncordons = asyncio.run(_stored(clean_servers, subjects.GPU_UNCORDONED + ".>"))
        assert [(e.gpu_index, e.by) for e in uncordons if isinstance(e, GpuUncordoned)] == [(spare, "operator")]
    finally:
        cluster.stop()


def test_a_fault_ends_after_the_hold_and_a_gpu_gone_from_telemetry_is_quarantined_missing(clean_servers, tmp_path):
    """On r4090-01 (no ECC memory, so an XID 48 leaves no error count behind): the XID's quarantine ends once the
    GPU has reported healthy for the hold; a GPU that vanishes without an XID is quarantined `missing` after
    GPU_MISSING_S and inventory counts it missing."""
    node = "r4090-01"
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", **FAST_FAILOVER, WHALEFLUX_GPU_QUARANTINE_HOLD_S="2",
                                WHALEFLUX_GPU_MISSING_S="2")
    inventory = cluster.service("inventory")
    agent = cluster.agent(node, interval_s=0.25, name="agent-r4090", http=True)
    try:
        scheduler.wait_ready()
        inventory.wait_ready()
        wait_until(lambda: httpx.get(agent.url + "/healthz").status_code == 200, what="agent admin port")
        wait_until(lambda: [n for n in httpx.get(scheduler.url + "/v1/nodes").json()
                            if n["status"] == "healthy" and n["heartbeat_age_s"] is not None], what="node heartbeating")

        def out() -> dict[int, dict]:
            rows = httpx.get(scheduler.url + "/v1/gpus", params={"status": "quarantined"}).json()
            return {g["index"]: g for g in rows}

        resp = httpx.post(agent.url + "/admin/faults", json={"kind": "xid48", "node": node, "gpu": 1}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        got = wait_until(out, what="XID 48 quarantined")
        assert list(got) == [1] and got[1]["cause"] == "xid"
        wait_until(lambda: not out(), what="released after the hold")
        uncordons = asyncio.run(_stored(clean_servers, subjects.GPU_UNCORDONED + ".>"))
        assert [(e.gpu_index, e.by) for e in uncordons if isinstance(e, GpuUncordoned)] == [(1, "scheduler")]

        resp = httpx.post(agent.url + "/admin/faults", json={"kind": "gpu-vanish", "node": node, "gpu": 2},
                          headers=AUTH)
        assert resp.status_code == 200, resp.text
        got = wait_until(out, what="the vanished GPU quarantined")
        assert list(got) == [2] and got[2]["cause"] == "missing" and "no telemetry" in got[2]["reason"]
        rows = wait_until(lambda: (r := [x for x in httpx.get(inventory.url + "/v1/inventory").json()
                                         if x["key"] == "RTX4090"]) and r[0]["missing"] == 1 and r,
                          what="inventory counts it missing")
        assert rows[0]["active"] == 3 and rows[0]["unhealthy"] == 0
    finally:
        cluster.stop()
