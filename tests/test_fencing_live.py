"""Exactly once through freezes and stalls, with real processes (issue 36, part 4): an agent frozen past its
placements' start-by runs none of them when it wakes and nothing runs twice; a NATS stall shorter than the
self-fence budget kills no running job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import defaultdict

import httpx
import pytest

from whaleflux.shared.events import JobFinished, JobPlaced, JobRequeued, JobStarted

from .lifecycle import assert_ran_once_each, own_servers, runs, start_stack, submit, wait_all_ended
from .processes import make_cluster, wait_until
from .test_crash_recovery import _job_history

# A placement not started this long after it was made never will be (its start-by): short, so a freeze passes it.
START_WITHIN_S = 4.0


@pytest.fixture
def own(tmp_path):
    servers = own_servers(tmp_path)
    yield servers
    servers.local.stop()


def _silent_for(scheduler_url: str, node: str, seconds: float) -> bool:
    """Whether the scheduler has not heard the node for `seconds` (its own view: the fault's length)."""
    nodes = {n["node"]: n for n in httpx.get(scheduler_url + "/v1/nodes", timeout=10).json()}
    age = nodes[node]["heartbeat_age_s"]
    return age is not None and age >= seconds


def _running(marks, ids) -> int:
    return sum(1 for j in ids if any(r.end is None for r in runs(marks, j)))


def _assert_attempts_never_overlap_and_one_succeeded(history: list, ids: list[str]) -> None:
    """The attempts' own reported start and end times (job.started, job.finished): one success each, no overlap."""
    started: dict[tuple[str, int], JobStarted] = {}
    finished: dict[tuple[str, int], JobFinished] = {}
    for e in history:
        if isinstance(e, JobStarted):
            started[(e.job_id, e.attempt)] = e
        elif isinstance(e, JobFinished):
            finished[(e.job_id, e.attempt)] = e
    spans = defaultdict(list)
    for (job_id, attempt), s in started.items():
        end = finished.get((job_id, attempt))
        assert end is not None, f"{job_id} attempt {attempt} started and never reported its end"
        spans[job_id].append((s.started_at, end.finished_at, attempt, end.exit_code))
    for job_id in ids:
        mine = sorted(spans[job_id])
        assert sum(1 for *_, code in mine if code == 0) == 1, f"{job_id}: {mine}"
        for a, b in zip(mine, mine[1:], strict=False):
            assert a[1] <= b[0], f"{job_id}: attempt {b[2]} started while attempt {a[2]} ran: {mine}"


def test_an_agent_frozen_past_its_placements_start_by_runs_none_of_them_and_nothing_twice(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, _ = start_stack(own.servers, tmp_path, "a100-01", WHALEFLUX_PASS_INTERVAL_S="0.3",
                                        WHALEFLUX_PLACEMENT_REPORT_S=str(START_WITHIN_S))
    agent = cluster.procs["agent"]
    stopped = False
    try:
        early = submit(scheduler.url, marks, 3.0, 4)
        wait_until(lambda: _running(marks, early) == 4, timeout=120, what="the first jobs running")
        os.kill(agent.process.pid, signal.SIGSTOP)  # its supervisors (other processes) run on
        stopped = True
        # A stream of short jobs while it is frozen: the scheduler, hearing nothing from its only node (a silence
        # it blames on itself), places them on the free GPUs, and those placements wait in the node's consumer.
        stream = submit(scheduler.url, marks, 1.0, 12)

        def placed_while_frozen() -> int:
            states = {j["job_id"]: j["state"] for j in httpx.get(scheduler.url + "/v1/jobs", timeout=10).json()}
            return sum(1 for j in stream if states.get(j) == "placed")

        wait_until(lambda: placed_while_frozen() >= 4, timeout=60, what="placements made while the agent is frozen")
        # The fault itself: frozen well past those placements' start-by (by the scheduler's view of its silence).
        wait_until(lambda: _silent_for(scheduler.url, "a100-01", 3 * START_WITHIN_S), timeout=60,
                   what="the agent frozen past the placements' start-by")
        os.kill(agent.process.pid, signal.SIGCONT)
        stopped = False
        ids = early + stream
        records = wait_all_ended(scheduler.url, ids, timeout=240)
        assert_ran_once_each(marks, ids, records)
        history = asyncio.run(_job_history(own.servers))
        _assert_attempts_never_overlap_and_one_succeeded(history, ids)
        # It did refuse what had gone stale, and the scheduler requeued each refused attempt once, on the node's word.
        lines = map(json.loads, agent.log_path.read_text().splitlines())
        refused = [e for e in lines if e.get("event") == "job.refused"]
        assert len(refused) >= 4, refused
        assert all("after its start-by" in e["reason"] for e in refused)
        requeued = [(e.job_id, e.attempt) for e in history if isinstance(e, JobRequeued)]
        assert sorted(requeued) == sorted(set(requeued))
        assert {(e["job_id"], e["attempt"]) for e in refused} <= set(requeued)
    finally:
        if stopped:
            os.kill(agent.process.pid, signal.SIGCONT)
        cluster.stop()


def test_a_frozen_agent_whose_node_is_declared_lost_runs_nothing_its_jobs_run_elsewhere(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster = make_cluster(own.servers, tmp_path)
    # One budget for all: the supervisors fence after 20 s of silence, the scheduler holds a lost node's jobs longer.
    cluster.base_env["WHALEFLUX_FENCE_AFTER_S"] = "20"
    scheduler = cluster.service("scheduler", WHALEFLUX_PASS_INTERVAL_S="0.3", WHALEFLUX_HEARTBEAT_SUSPECT_S="3",
                                WHALEFLUX_HEARTBEAT_LOST_S="5", WHALEFLUX_PREEMPTION_GRACE_S="2",
                                WHALEFLUX_PLACEMENT_REPORT_S=str(START_WITHIN_S))
    frozen = cluster.agent("a100-01", name="agent-a100")
    cluster.agent("h100-01", name="agent-h100")
    stopped = False
    try:
        scheduler.wait_ready()
        wait_until(lambda: len(httpx.get(scheduler.url + "/v1/nodes").json()) == 2, what="both nodes registered")
        early = submit(scheduler.url, marks, 4.0, 12)
        wait_until(lambda: _running(marks, early) >= 10, timeout=120, what="jobs running on both nodes")
        os.kill(frozen.process.pid, signal.SIGSTOP)
        stopped = True
        only_there = submit(scheduler.url, marks, 1.0, 4, gpu_models=["A100"])
        anywhere = submit(scheduler.url, marks, 1.0, 8)
        wait_until(lambda: _silent_for(scheduler.url, "a100-01", 12), timeout=60, what="the node lost, frozen on")
        nodes = {n["node"]: n["status"] for n in httpx.get(scheduler.url + "/v1/nodes", timeout=10).json()}
        assert nodes == {"a100-01": "lost", "h100-01": "healthy"}
        os.kill(frozen.process.pid, signal.SIGCONT)
        stopped = False
        ids = early + only_there + anywhere
        records = wait_all_ended(scheduler.url, ids, timeout=240)
        assert_ran_once_each(marks, ids, records)
        history = asyncio.run(_job_history(own.servers))
        _assert_attempts_never_overlap_and_one_succeeded(history, ids)
        assert any(isinstance(e, JobRequeued) and e.cause == "node_lost" for e in history)
    finally:
        if stopped:
            os.kill(frozen.process.pid, signal.SIGCONT)
        cluster.stop()


def test_a_nats_stall_of_20_s_kills_no_running_job_and_each_finishes_once(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, _ = start_stack(own.servers, tmp_path, "a100-01")
    nats = own._proc("nats-server")
    stalled = False
    try:
        ids = submit(scheduler.url, marks, 30.0, 4)
        wait_until(lambda: _running(marks, ids) == 4, timeout=120, what="the jobs running")
        os.kill(nats.pid, signal.SIGSTOP)  # connections stay up; nothing is answered or delivered
        stalled = True
        # The fault: 20 s of silence, as the scheduler sees it (its HTTP API answers from its own state).
        wait_until(lambda: _silent_for(scheduler.url, "a100-01", 20), timeout=60, what="a 20 s stall")
        assert _running(marks, ids) == 4, "every job outlived the stall (the self-fence budget is longer)"
        os.kill(nats.pid, signal.SIGCONT)
        stalled = False
        records = wait_all_ended(scheduler.url, ids, timeout=180)
        assert_ran_once_each(marks, ids, records)
        assert all(len(runs(marks, j)) == 1 and not runs(marks, j)[0].stopped for j in ids)
        history = asyncio.run(_job_history(own.servers))
        _assert_attempts_never_overlap_and_one_succeeded(history, ids)
        assert not [e for e in history if isinstance(e, JobRequeued)]
        assert sorted(e.job_id for e in history if isinstance(e, JobPlaced)) == sorted(ids)
    finally:
        if stalled:
            os.kill(nats.pid, signal.SIGCONT)
        cluster.stop()
