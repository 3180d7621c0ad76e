"""An agent whose placement consumer cannot be created yet (JetStream does not answer: NATS stalled, or too busy
with a thousand nodes' consumers at once) waits for it, logging each try, then comes up and runs jobs."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
from structlog.testing import capture_logs

from whaleflux.agent.node import NodeAgent
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import FleetNode, gpu_models
from whaleflux.shared.streams import agent_consumer

from .lifecycle import AUTH, own_servers
from .processes import connect_bus, make_cluster, until

CLUSTER, NODE = "onprem", "h100-31"


async def test_an_agent_waits_for_its_placement_consumer_and_then_runs_a_job(tmp_path):
    own = own_servers(tmp_path)
    cluster = make_cluster(own.servers, tmp_path)
    nats_pid = own._proc("nats-server").pid
    stalled = False
    bus = None
    agent = None
    try:
        scheduler = cluster.service("scheduler")
        await asyncio.to_thread(scheduler.wait_ready)
        bus = await connect_bus(own.servers)  # connected, streams declared: as the agent is before its nodes start
        node = FleetNode(name=NODE, group="h100", cluster=CLUSTER, rack="r1", pool="default", ownership="owned",
                         gpu_model="H100", gpus=2, interconnect="nvlink")
        backend = SimulatedNode(NODE, gpu_models()["H100"], 2, interconnect="nvlink")
        agent = NodeAgent(bus, node, backend, interval_s=0.5, log_dir=tmp_path / "jobs",
                          attempts_dir=tmp_path / "attempts")
        os.kill(nats_pid, signal.SIGSTOP)  # the connection stays up, JetStream answers nothing
        stalled = True
        with capture_logs() as logs:
            start = asyncio.create_task(agent.start())
            # The first try times out (the JetStream API's 5 s); the agent does not fail, it waits and tries again.
            await until(lambda: any(e["event"] == "bus.consumer_waiting" for e in logs), 60, "a retry logged")
            assert not start.done()
            os.kill(nats_pid, signal.SIGCONT)
            stalled = False
            await asyncio.wait_for(start, 120)  # raises whatever start raised
        waiting = [e for e in logs if e["event"] == "bus.consumer_waiting"]
        assert waiting[0]["consumer"] == agent_consumer(CLUSTER, NODE).durable
        assert "TimeoutError" in waiting[0]["error"] and waiting[0]["retry_in_s"] >= 0
        assert any(e["event"] == "bus.consumer_created" for e in logs)

        marks = tmp_path / "ran"
        async with httpx.AsyncClient(base_url=scheduler.url, headers=AUTH, timeout=30) as http:
            reply = await http.post("/v1/jobs", json={"name": "after-the-wait", "gpus": 1,
                                                      "command": ["sh", "-c", f"echo ran > {marks}"]})
            assert reply.status_code in (200, 201, 202), reply.text
            job_id = reply.json()["job_id"]

            async def succeeded() -> bool:
                return (await http.get(f"/v1/jobs/{job_id}")).json()["state"] == "succeeded"

            await until(succeeded, 120, "the job run on the agent's node")
        assert marks.read_text().strip() == "ran"
    finally:
        if stalled:
            os.kill(nats_pid, signal.SIGCONT)
        if agent is not None:
            await agent.stop()
        if bus is not None:
            await bus.close()
        cluster.stop()
        own.local.stop()
