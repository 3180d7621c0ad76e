"""Virtual jobs (`WHALEFLUX_VIRTUAL_JOBS=1`, the scale harness's mode): a real agent process on real NATS,
placements published straight to it. A placed `sleep N` starts no process: it reports job.started, is
listed in heartbeats while it "runs", reports job.finished with exit 0 after N s, and obeys a stop order."""

from __future__ import annotations

from datetime import UTC, datetime

from nats.js.errors import NotFoundError

from whaleflux.agent.node import NodeAgent
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.agent.virtual import stated_run
from whaleflux.shared import subjects
from whaleflux.shared.catalog import FleetNode, gpu_models
from whaleflux.shared.events import JobFinished, JobPlaced, JobPreempted, NodeHeartbeat, NodeRegistered, decode
from whaleflux.shared.streams import agent_consumer

from .processes import connect_bus, make_cluster, until

CLUSTER, NODE = "onprem", "a100-01"


def test_a_virtual_job_runs_for_the_duration_its_command_states():
    assert stated_run(["sleep", "30"], {}) == (30.0, 0)
    assert stated_run(["sh", "-c", "sleep 2.5"], {}) == (2.5, 0)
    assert stated_run(["python", "train.py"], {"WHALEFLUX_VIRTUAL_S": "12"}) == (12.0, 0)
    assert stated_run(["true"], {}) == (0.0, 0)
    assert stated_run(["false"], {}) == (0.0, 1)


async def _last(bus, stream: str, subject: str):
    try:
        msg = await bus.js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    return decode(msg.data)


async def _count(bus, subject: str) -> int:
    info = await bus.js.stream_info("WHALEFLUX_JOBS", subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def _heartbeat_after(bus, since: datetime) -> NodeHeartbeat | None:
    last = await _last(bus, "WHALEFLUX_NODES", subjects.node_heartbeat(CLUSTER, NODE))
    return last[1] if last is not None and last[0].time > since else None


async def _place(bus, job_id: str, command: list[str]) -> None:
    registered = await until(lambda: _last(bus, "WHALEFLUX_NODES", subjects.node_registered(CLUSTER, NODE)),
                             timeout=30, what="node registered")
    data: NodeRegistered = registered[1]
    gpu = data.gpus[0]
    placed = JobPlaced(job_id=job_id, attempt=1, cluster=CLUSTER, node=NODE, gpu_model=gpu.model, gpu_uuids=[gpu.uuid],
                       gpu_indices=[gpu.index], command=command, team="t", project="p")
    await bus.publish(subjects.job_placed(CLUSTER, NODE), placed, event_id=f"placed-{job_id}-1", correlation_id=job_id)


async def test_a_virtual_job_reports_its_start_is_listed_while_it_runs_and_ends_with_exit_0(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    bus = await connect_bus(clean_servers)
    try:
        cluster.agent(NODE, interval_s=0.3, WHALEFLUX_VIRTUAL_JOBS="1")
        await _place(bus, "virtual-1", ["sleep", "2"])
        await until(lambda: _count(bus, subjects.job_started(CLUSTER, NODE)), timeout=30, what="job.started")
        since = datetime.now(UTC)
        heartbeat = await until(lambda: _heartbeat_after(bus, since), timeout=30, what="a heartbeat while it runs")
        [listed] = heartbeat.attempts
        assert (listed.job_id, listed.attempt, listed.state) == ("virtual-1", 1, "running")

        await until(lambda: _count(bus, subjects.job_finished(CLUSTER, NODE)), timeout=30, what="job.finished")
        finished: JobFinished = (await _last(bus, "WHALEFLUX_JOBS", subjects.job_finished(CLUSTER, NODE)))[1]
        assert (finished.job_id, finished.exit_code, finished.interrupted) == ("virtual-1", 0, None)
        assert 1.5 <= (finished.finished_at - finished.started_at).total_seconds()
        # No process ran: no log and no attempt folder were left.
        assert not (tmp_path / "home" / "jobs" / "virtual-1.1.log").exists()
        assert not (tmp_path / "home" / "attempts" / CLUSTER / NODE / "virtual-1.1").exists()
        since = datetime.now(UTC)
        heartbeat = await until(lambda: _heartbeat_after(bus, since), timeout=30, what="a heartbeat after its end")
        [listed] = heartbeat.attempts
        assert (listed.state, listed.exit_code) == ("exited", 0)
    finally:
        cluster.stop()
        await bus.close()


async def test_a_virtual_job_obeys_a_stop_order_and_is_reported_interrupted(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    bus = await connect_bus(clean_servers)
    try:
        cluster.agent(NODE, interval_s=0.3, WHALEFLUX_VIRTUAL_JOBS="1")
        await _place(bus, "stopped-1", ["sleep", "3600"])
        await until(lambda: _count(bus, subjects.job_started(CLUSTER, NODE)), timeout=30, what="job.started")
        order = JobPreempted(job_id="stopped-1", attempt=1, cluster=CLUSTER, node=NODE, reason="make room", grace_s=5)
        await bus.publish(subjects.job_preempted(CLUSTER, NODE), order, event_id="preempted-stopped-1-1")

        await until(lambda: _count(bus, subjects.job_finished(CLUSTER, NODE)), timeout=30, what="job.finished")
        finished: JobFinished = (await _last(bus, "WHALEFLUX_JOBS", subjects.job_finished(CLUSTER, NODE)))[1]
        assert finished.job_id == "stopped-1" and finished.exit_code == -15
        assert finished.interrupted == "stopped by the scheduler: make room"
    finally:
        cluster.stop()
        await bus.close()


async def test_a_stopped_agent_takes_no_more_orders_and_the_next_one_on_the_same_connection_runs_them(
        clean_servers, tmp_path):
    bus = await connect_bus(clean_servers)
    node = FleetNode(name=NODE, group="a100", cluster=CLUSTER, rack="r1", pool="default", ownership="owned",
                     gpu_model="A100", gpus=2, interconnect="nvlink")

    def agent() -> NodeAgent:
        return NodeAgent(bus, node, SimulatedNode(NODE, gpu_models()["A100"], 2, interconnect="nvlink"),
                         interval_s=0.2, log_dir=tmp_path / "jobs", attempts_dir=tmp_path / "attempts",
                         virtual_jobs=True)

    durable = agent_consumer(CLUSTER, NODE).durable
    try:
        first = agent()
        await first.start()
        assert durable in bus.running_consumers()
        await first.stop()
        assert durable not in bus.running_consumers()  # its placement consumer stopped with it
        await _place(bus, "after-stop", ["sleep", "0"])  # waits in the durable consumer for the next agent
        second = agent()
        await second.start()  # on the same connection: refused while the first one's consumer still ran
        await until(lambda: _count(bus, subjects.job_finished(CLUSTER, NODE)), timeout=30,
                    what="the placement run by the next agent")
        finished: JobFinished = (await _last(bus, "WHALEFLUX_JOBS", subjects.job_finished(CLUSTER, NODE)))[1]
        assert (finished.job_id, finished.exit_code, finished.interrupted) == ("after-stop", 0, None)
        assert await _count(bus, subjects.job_started(CLUSTER, NODE)) == 1
        await second.stop()
    finally:
        await bus.close()
