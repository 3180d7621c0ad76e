"""The running scheduler carries out the queue policy's moves (checkpoint-restart on faster GPUs).

Real NATS and Redis, a scheduler process and a simulated agent process for
h100-01 and a100-01 (8 GPUs each); jobs are real processes that checkpoint.
"""

from __future__ import annotations

import asyncio
import sys

import httpx

from whaleflux.shared.events import JobFinished, JobPlaced, JobPreempted, JobRequeued, JobStarted

from .processes import make_cluster, wait_until
from .test_crash_recovery import _job_history
from .test_failover import AUTH, JOB, _checkpoint, _job

# Holds its GPUs until the test creates the file it names.
BLOCKER = """
import pathlib, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


def _submit(scheduler, command: list[str], **body) -> str:
    resp = httpx.post(scheduler.url + "/v1/jobs", json={"name": "train", "command": command, **body}, headers=AUTH)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]


def test_a_long_checkpointable_job_moves_to_faster_gpus_when_they_free_and_a_restart_job_stays(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", WHALEFLUX_PREEMPTION_GRACE_S="2", WHALEFLUX_PASS_INTERVAL_S="0.3")
    cluster.agent("h100-01", "a100-01", interval_s=0.5)
    job, blocker, release = tmp_path / "job.py", tmp_path / "blocker.py", tmp_path / "release"
    job.write_text(JOB)
    blocker.write_text(BLOCKER)
    try:
        scheduler.wait_ready()
        wait_until(lambda: len(httpx.get(scheduler.url + "/v1/nodes").json()) == 2, what="both nodes registered")

        # The H100 node is held by another job, so both long jobs start at once on the A100s.
        holder = _submit(scheduler, [sys.executable, str(blocker), str(release)], gpus=8, gpu_models=["H100"])
        wait_until(lambda: _job(scheduler, holder)["state"] == "running", what="H100 node held")
        train = dict(gpus=2, gpu_models=["H100", "A100"], workload_class="llm-train", expected_runtime_s=36000,
                     preemptible=True)
        mover = _submit(scheduler, [sys.executable, str(job), "100"], **train)
        stayer = _submit(scheduler, [sys.executable, str(job), "120"], resume="restart", **train)
        for job_id in (mover, stayer):
            wait_until(lambda job_id=job_id: (j := _job(scheduler, job_id))["state"] == "running"
                       and j["node"] == "a100-01",
                       what=f"{job_id} running on the A100s")
        wait_until(lambda: _checkpoint(tmp_path, mover) >= 5, what="mover checkpointed")

        release.touch()  # the H100s free: the checkpointable job moves there, the restart one stays
        done = wait_until(lambda: (j := _job(scheduler, mover))["state"] == "succeeded" and j, timeout=90,
                          what="moved job done")
        assert (done["attempt"], done["node"], done["gpu_model"]) == (2, "h100-01", "H100")
        assert done["migrations"] == 1 and done["preemptions"] == 0
        [line] = done["requeues"]
        assert line.startswith("attempt 1 on a100-01: migrate to faster GPUs: H100 on h100-01")
        home = tmp_path / "home" / "jobs"
        assert "sigterm at" in (home / f"{mover}.1.log").read_text()
        resumed = (home / f"{mover}.2.log").read_text()
        assert "attempt=2 resume=1" in resumed and "done at 100" in resumed
        assert int(resumed.split("from=")[1].split()[0]) >= 5
        stayed = wait_until(lambda: (j := _job(scheduler, stayer))["state"] == "succeeded" and j, timeout=90,
                            what="restart job done")
        assert (stayed["attempt"], stayed["node"], stayed["migrations"]) == (1, "a100-01", 0)

        history = asyncio.run(_job_history(clean_servers))
        of = [e for e in history if getattr(e, "job_id", None) == mover]
        assert [(e.attempt, e.node, e.resume) for e in of if isinstance(e, JobPlaced)] == [
            (1, "a100-01", False), (2, "h100-01", True)]
        preempted = [(e.job_id, e.attempt, e.node, e.grace_s, e.reason) for e in history if isinstance(e, JobPreempted)]
        assert [p[:4] for p in preempted] == [(mover, 1, "a100-01", 2)], preempted  # none for the restart job
        [requeued] = [e for e in history if isinstance(e, JobRequeued)]
        assert requeued.job_id == mover and requeued.cause == "preempted" and "faster GPUs" in requeued.reason
        # Never two copies: the new attempt started only after the old one had stopped.
        [stopped] = [e for e in of if isinstance(e, JobFinished) and e.attempt == 1]
        [started] = [e for e in of if isinstance(e, JobStarted) and e.attempt == 2]
        assert started.started_at >= stopped.finished_at
    finally:
        cluster.stop()
