"""Faults against real processes: whatever is wiped, stopped or restarted, no finished job runs again,
no two attempts of a job overlap, no job is stuck, and billing charges what the jobs themselves say ran."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import httpx
import pytest

from whaleflux.shared.events import JobRequeued

from .lifecycle import (
    AUTH,
    assert_billed_what_ran,
    assert_ran_once_each,
    checkpointing_command,
    first_steps,
    jobs,
    own_servers,
    runs,
    start_stack,
    submit,
    wait_all_ended,
)
from .processes import wait_until
from .rootjobs import ROOT_JOBS
from .test_crash_recovery import _job_history


@pytest.fixture
def own(tmp_path):
    servers = own_servers(tmp_path)
    yield servers
    servers.local.stop()


def _some_running(marks, ids, n):
    return sum(1 for j in ids if any(r.end is None for r in runs(marks, j))) >= n


def test_redis_flushall_mid_run_reruns_no_finished_job_and_loses_none(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, billing = start_stack(own.servers, tmp_path, "a100-01")
    log = cluster.procs["scheduler"].log_path
    try:
        ids = submit(scheduler.url, marks, 2.0, 12)
        # Some have finished, some run, some wait (12 jobs on 8 GPUs).
        wait_until(lambda: sum(1 for j in ids if any(r.end for r in runs(marks, j))) >= 2
                   and _some_running(marks, ids, 4), timeout=180, what="jobs finished and running")
        folds = len(_log_events(log, "state.folded"))  # the first start's rebuild (an empty store) is one
        own.flushall()
        # The store's loss is noticed while running and the state rebuilt from JetStream (until then the API
        # answers 503 instead of answering from nothing: a submission may meet that window, so wait it out).
        wait_until(lambda: len(_log_events(log, "state.folded")) > folds, timeout=180, what="state rebuilt")
        wait_until(lambda: httpx.get(scheduler.url + "/readyz").status_code == 200
                   and len(httpx.get(scheduler.url + "/v1/nodes").json()) == 1, timeout=180, what="scheduler rebuilt")
        late = submit(scheduler.url, marks, 1.0, 1)  # a job submitted after the wipe runs too
        records = wait_all_ended(scheduler.url, ids + late)
        assert_ran_once_each(marks, ids + late, records)
        assert_billed_what_ran(billing.url, marks, ids + late)
    finally:
        cluster.stop()


def _log_events(path, event: str) -> list[dict]:
    return [line for line in map(json.loads, path.read_text().splitlines()) if line.get("event") == event]


def test_a_rebuild_from_the_snapshot_and_the_tail_reruns_nothing(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, billing = start_stack(own.servers, tmp_path, "a100-01", WHALEFLUX_SNAPSHOT_INTERVAL_S="1")
    log = cluster.procs["scheduler"].log_path
    try:
        early = submit(scheduler.url, marks, 0.5, 4)
        wait_all_ended(scheduler.url, early)
        wait_until(lambda: any(e["jobs"] >= 4 for e in _log_events(log, "history.snapshot")), timeout=30,
                   what="a snapshot holding the finished jobs")
        late = submit(scheduler.url, marks, 2.0, 6)
        wait_until(lambda: _some_running(marks, late, 3), timeout=180, what="late jobs running")
        own.flushall()
        records = wait_all_ended(scheduler.url, early + late)
        assert_ran_once_each(marks, early + late, records)
        folded = _log_events(log, "state.folded")[-1]
        assert folded["jobs"] == len(early + late)
        history = asyncio.run(_job_history(own.servers))
        assert folded["events"] < len(history), "the rebuild read the tail after the snapshot, not the whole stream"
        assert_billed_what_ran(billing.url, marks, early + late)
    finally:
        cluster.stop()


def test_redis_down_for_10_s_loses_no_node_and_reruns_nothing(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, billing = start_stack(own.servers, tmp_path, "a100-01", "h100-01")
    try:
        ids = submit(scheduler.url, marks, 3.0, 10)
        wait_until(lambda: _some_running(marks, ids, 4), timeout=180, what="jobs running")
        own.stop_redis()
        # While it is down the API answers 503 with the reason, never 500.
        r = wait_until(lambda: (r := httpx.post(scheduler.url + "/v1/jobs", json={"name": "x", "command": ["true"]},
                                                headers=AUTH, timeout=10)).status_code == 503 and r,
                       timeout=20, what="503 during the outage")
        assert "state store" in r.json()["detail"]
        time.sleep(10)  # the fault itself: Redis stays down this long, longer than heartbeat_lost_s
        own.start_redis()
        records = wait_all_ended(scheduler.url, ids)
        assert_ran_once_each(marks, ids, records)
        lost = [e for e in asyncio.run(_job_history(own.servers)) if isinstance(e, JobRequeued)]
        assert lost == [], "no node was declared lost for the scheduler's own outage"
        assert all(n["status"] == "healthy" for n in httpx.get(scheduler.url + "/v1/nodes").json())
        assert_billed_what_ran(billing.url, marks, ids)
    finally:
        cluster.stop()


def test_nats_server_restarted_mid_run_loses_no_event_and_reruns_nothing(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, billing = start_stack(own.servers, tmp_path, "a100-01")
    try:
        ids = submit(scheduler.url, marks, 2.0, 10)
        wait_until(lambda: _some_running(marks, ids, 4), timeout=180, what="jobs running")
        own.restart_nats()
        records = wait_all_ended(scheduler.url, ids)
        assert_ran_once_each(marks, ids, records)
        assert_billed_what_ran(billing.url, marks, ids)
        assert len(jobs(scheduler.url)) == len(ids)
    finally:
        cluster.stop()


def test_agent_kill_9_mid_job_loses_no_end_and_bills_what_ran(own, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    cluster, scheduler, billing = start_stack(own.servers, tmp_path, "a100-01")
    agent = cluster.procs["agent"]
    try:
        short = submit(scheduler.url, marks, 1.5, 3)  # these end while the agent is down
        long = submit(scheduler.url, marks, 6.0, 3)  # these are still running when it is back
        wait_until(lambda: _some_running(marks, short + long, 6), timeout=180, what="all six running")
        agent.kill9()
        wait_until(lambda: all(r.end for j in short for r in runs(marks, j)), timeout=30,
                   what="short jobs ended meanwhile")
        agent.start()
        records = wait_all_ended(scheduler.url, short + long)
        assert_ran_once_each(marks, short + long, records)
        # The ends reported after the restart carry the real end time, not the restart's.
        for job_id in short:
            [run] = runs(marks, job_id)
            finished = records[job_id]["finished_at"]
            assert run.end is not None, run
            assert abs(datetime.fromisoformat(finished).timestamp() - run.end) < 1.0, (job_id, finished, run)
        assert_billed_what_ran(billing.url, marks, short + long)
    finally:
        cluster.stop()


def _up(home, out_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    with open(out_path, "ab") as out:
        # Its own session, as a terminal's foreground group: Ctrl-C reaches `up` and all its children at once.
        return subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True), env


def _ready_up(home):
    def ready():
        services = json.loads((home / "config.json").read_text())["services"]
        return all(httpx.get(services[s] + "/readyz", timeout=1).status_code == 200
                   for s in ("scheduler", "billing")) and services
    return wait_until(ready, timeout=180, what="up ready")


def test_ctrl_c_of_up_interrupts_the_job_and_it_resumes_from_its_checkpoint_when_up_is_back(tmp_path):
    home, marks = tmp_path / "home", tmp_path / "marks"
    marks.mkdir()
    up, _env = _up(home, tmp_path / "up.out")
    try:
        services = _ready_up(home)
        token = {"Authorization": f"Bearer {json.loads((home / 'config.json').read_text())['admin_token']}"}
        # 15 s of steps: the job's own marks miss its process start and exit (tens of ms per attempt), well
        # within 1% of that.
        body = {"name": "ckpt", "command": checkpointing_command(marks, steps=60), "gpu_models": ["A100"]}
        job_id = httpx.post(services["scheduler"] + "/v1/jobs", json=body, headers=token, timeout=10).json()["job_id"]
        step = home / "areas" / job_id / "checkpoints" / "step"
        wait_until(lambda: step.exists() and int(step.read_text()) >= 4, timeout=180, what="job past step 4")
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C
        assert up.wait(timeout=90) == 0
        [run] = runs(marks, job_id)
        assert run.stopped, f"the job got SIGTERM from the planned stop: {run}"
        stopped_at = int((home / "areas" / job_id / "checkpoints" / "step").read_text())

        up, _env = _up(home, tmp_path / "up.out")
        services = _ready_up(home)

        def done():
            job = httpx.get(f"{services['scheduler']}/v1/jobs/{job_id}", timeout=5).json()
            return job.get("state") in ("succeeded", "failed") and job
        job = wait_until(done, timeout=120, what="job ended after the restart")
        assert job["state"] == "succeeded" and job["attempt"] == 2, job
        assert any("interrupted" in line for line in job["requeues"]), job["requeues"]
        starts = first_steps(marks, job_id)
        assert starts[0] == (1, 0, "0") and starts[1][0] == 2 and starts[1][2] == "1", starts
        assert starts[1][1] == stopped_at > 0, "the second attempt resumed from the checkpoint the first one wrote"
        runs_ = runs(marks, job_id)
        assert runs_[0].end is not None and runs_[0].end <= runs_[1].start
        assert_billed_what_ran(services["billing"], marks, [job_id])  # both attempts, the interrupted one included
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
