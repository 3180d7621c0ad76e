"""A job outlives its agent: real NATS, a real agent process, a placement published straight to it.

kill -9 of the agent while its job runs, then a restart: the job's end is reported once, with the
time it really ended; a job still running is re-adopted; one whose supervisor died unrecorded is left
to the scheduler to end as lost. A planned stop (SIGTERM) reports the job as interrupted, not failed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from nats.js.errors import NotFoundError

from whaleflux.agent import attempts
from whaleflux.shared import subjects
from whaleflux.shared.events import JobFinished, JobPlaced, NodeHeartbeat, NodeRegistered, decode

from .processes import connect_bus, make_cluster, until

CLUSTER, NODE = "onprem", "a100-01"
PLANNED_STOP = "agent stopped: planned shutdown"

# Marks (written atomically) when it starts, on SIGTERM (then exits 143), and when it ends (exit 7);
# runs until the test creates `release`.
JOB = r"""
import json, os, signal, sys, time
from pathlib import Path

marks = Path(sys.argv[1])

def mark(name):
    tmp = marks / (name + ".tmp")
    tmp.write_text(json.dumps({"t": time.time(), "pid": os.getpid()}))
    os.replace(tmp, marks / name)

def on_sigterm(signum, frame):
    mark("sigterm")
    raise SystemExit(143)

signal.signal(signal.SIGTERM, on_sigterm)
mark("start")
while not (marks / "release").exists():
    time.sleep(0.05)
mark("end")
raise SystemExit(7)
"""


def _mark(marks: Path, name: str) -> dict | None:
    path = marks / name
    return json.loads(path.read_text()) if path.exists() else None


def _must(marks: Path, name: str) -> dict:
    mark = _mark(marks, name)
    assert mark is not None, f"the job left no {name} mark"
    return mark


def _at(mark: dict) -> datetime:
    return datetime.fromtimestamp(mark["t"], UTC)


async def _last(bus, stream: str, subject: str):
    """The latest event on `subject` (envelope, data), or None."""
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


async def _start(servers, tmp_path: Path):
    cluster = make_cluster(servers, tmp_path)
    # Restarts in these tests take a few seconds at most; the job must not stop itself meanwhile.
    cluster.base_env["WHALEFLUX_FENCE_AFTER_S"] = "60"
    bus = await connect_bus(servers)
    agent = cluster.agent(NODE, interval_s=0.3)
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return cluster, bus, agent, marks, script


async def _place(bus, script: Path, marks: Path, job_id: str) -> None:
    """Place the job on the node's first GPU, as the scheduler would, once the agent registered."""
    registered = await until(lambda: _last(bus, "WHALEFLUX_NODES", subjects.node_registered(CLUSTER, NODE)),
                             timeout=30, what="node registered")
    data: NodeRegistered = registered[1]
    gpu = data.gpus[0]
    placed = JobPlaced(job_id=job_id, attempt=1, cluster=CLUSTER, node=NODE, gpu_model=gpu.model, gpu_uuids=[gpu.uuid],
                       gpu_indices=[gpu.index], command=[sys.executable, str(script), str(marks)], team="t",
                       project="p")
    await bus.publish(subjects.job_placed(CLUSTER, NODE), placed, event_id=f"placed-{job_id}-1", correlation_id=job_id)
    await until(lambda: _mark(marks, "start"), timeout=30, what="job started")
    await until(lambda: _count(bus, subjects.job_started(CLUSTER, NODE)), timeout=30, what="job.started published")


async def _finished(bus) -> JobFinished:
    return (await _last(bus, "WHALEFLUX_JOBS", subjects.job_finished(CLUSTER, NODE)))[1]


async def test_a_job_that_ends_while_its_agent_is_dead_is_reported_once_with_its_real_end_after_restart(
        clean_servers, tmp_path):
    cluster, bus, agent, marks, script = await _start(clean_servers, tmp_path)
    try:
        await _place(bus, script, marks, "outlives-1")
        agent.kill9()
        (marks / "release").touch()
        end = await until(lambda: _mark(marks, "end"), timeout=30, what="job ended on its own")
        recorded = tmp_path / "home" / "attempts" / CLUSTER / NODE / "outlives-1.1" / "exit.json"
        await until(recorded.exists, timeout=30, what="its supervisor recorded the end")
        restarted = datetime.now(UTC)
        agent.start()

        heartbeat = await until(lambda: _heartbeat_after(bus, restarted), timeout=30, what="heartbeat after restart")
        [listed] = heartbeat.attempts
        assert (listed.job_id, listed.attempt, listed.state, listed.exit_code) == ("outlives-1", 1, "exited", 7)
        assert await _count(bus, subjects.job_finished(CLUSTER, NODE)) == 1
        finished = await _finished(bus)
        assert (finished.job_id, finished.attempt, finished.exit_code, finished.interrupted) == (
            "outlives-1", 1, 7, None)
        assert abs((finished.finished_at - _at(end)).total_seconds()) < 1.0 and finished.finished_at < restarted
        assert abs((finished.started_at - _at(_must(marks, "start"))).total_seconds()) < 1.0
        assert listed.finished_at == finished.finished_at and heartbeat.running_jobs == []
        assert await _count(bus, subjects.job_started(CLUSTER, NODE)) == 1
    finally:
        cluster.stop()
        await bus.close()


async def test_a_job_still_running_when_its_agent_restarts_is_re_adopted_and_reported_when_it_ends(
        clean_servers, tmp_path):
    cluster, bus, agent, marks, script = await _start(clean_servers, tmp_path)
    try:
        await _place(bus, script, marks, "adopted-1")
        agent.kill9()
        restarted = datetime.now(UTC)
        agent.start()

        heartbeat = await until(lambda: _heartbeat_after(bus, restarted), timeout=30, what="heartbeat after restart")
        [listed] = heartbeat.attempts
        assert (listed.job_id, listed.state, listed.exit_code) == ("adopted-1", "running", None)
        assert abs((listed.started_at - _at(_must(marks, "start"))).total_seconds()) < 1.0
        assert heartbeat.running_jobs == ["adopted-1"] and await _count(bus, subjects.job_finished(CLUSTER, NODE)) == 0

        (marks / "release").touch()
        await until(lambda: _count(bus, subjects.job_finished(CLUSTER, NODE)), timeout=30, what="job.finished")
        finished = await _finished(bus)
        assert (finished.job_id, finished.exit_code, finished.interrupted) == ("adopted-1", 7, None)
        assert abs((finished.finished_at - _at(_must(marks, "end"))).total_seconds()) < 1.0
        assert _mark(marks, "sigterm") is None
    finally:
        cluster.stop()
        await bus.close()


async def test_a_planned_agent_stop_reports_the_job_interrupted_before_the_agent_exits(clean_servers, tmp_path):
    cluster, bus, agent, marks, script = await _start(clean_servers, tmp_path)
    try:
        await _place(bus, script, marks, "planned-1")
        agent.popen.terminate()
        assert agent.popen.wait(timeout=30) == 0

        assert await _count(bus, subjects.job_finished(CLUSTER, NODE)) == 1
        finished = await _finished(bus)
        assert (finished.job_id, finished.exit_code, finished.interrupted) == ("planned-1", 143, PLANNED_STOP)
        sigterm = _mark(marks, "sigterm")
        assert sigterm is not None and sigterm["pid"] == _must(marks, "start")["pid"] and _mark(marks, "end") is None
    finally:
        cluster.stop()
        await bus.close()


async def test_an_attempt_whose_supervisor_died_unrecorded_is_neither_reported_nor_listed_after_restart(
        clean_servers, tmp_path):
    cluster, bus, agent, marks, script = await _start(clean_servers, tmp_path)
    try:
        await _place(bus, script, marks, "vanished-1")
        agent.kill9()
        # As after a reboot: supervisor and job gone, no exit.json.
        attempt_dir = tmp_path / "home" / "attempts" / CLUSTER / NODE / "vanished-1.1"
        running = attempts.read_running(attempt_dir)
        assert running is not None
        os.kill(running.supervisor_pid, signal.SIGKILL)
        os.killpg(running.job_pid, signal.SIGKILL)
        await until(lambda: not attempts.supervisor_alive(running.supervisor_pid, attempt_dir), what="supervisor gone")
        restarted = datetime.now(UTC)
        agent.start()

        heartbeat = await until(lambda: _heartbeat_after(bus, restarted), timeout=30, what="heartbeat after restart")
        assert heartbeat.attempts == [] and heartbeat.running_jobs == []
        assert not attempt_dir.exists() and await _count(bus, subjects.job_finished(CLUSTER, NODE)) == 0
    finally:
        cluster.stop()
        await bus.close()
