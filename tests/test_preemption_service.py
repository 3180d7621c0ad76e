"""The queue policy in the running service: rejection at submission, priorities, preemption and resume.

Real NATS and Redis, a scheduler process and a simulated agent process
(r4090-01, 4 GPUs); jobs are real processes that checkpoint.
"""

from __future__ import annotations

import asyncio
import sys

import httpx

from whaleflux.shared.events import JobPreempted, JobRequeued, JobSubmitted

from .processes import make_cluster, wait_until
from .test_crash_recovery import _job_history
from .test_failover import AUTH, JOB, _checkpoint, _job

# JOB, which also keeps going past its steps until the file named by its second argument exists: the
# low-priority job is still running when the high-priority one arrives, however slow the machine is.
GATED_JOB = JOB.replace("while step < int(sys.argv[1]):",
                        "while step < int(sys.argv[1]) or not pathlib.Path(sys.argv[2]).exists():")
assert GATED_JOB != JOB


def test_high_priority_job_preempts_a_preemptible_one_which_resumes_from_its_checkpoint(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service(
        "scheduler", WHALEFLUX_MIN_RUN_BEFORE_PREEMPTION_S="0", WHALEFLUX_PREEMPTION_GRACE_S="3",
        WHALEFLUX_PASS_INTERVAL_S="0.3",
    )
    cluster.agent("r4090-01", interval_s=0.5)
    script, gate = tmp_path / "job.py", tmp_path / "low-may-finish"
    script.write_text(GATED_JOB)
    try:
        scheduler.wait_ready()
        wait_until(lambda: httpx.get(scheduler.url + "/v1/nodes").json(), what="node registered")

        # Infeasible jobs are refused at submission, with the reason.
        big = {"name": "big", "command": ["true"], "gpus": 8}
        too_big = httpx.post(scheduler.url + "/v1/jobs", json=big, headers=AUTH)
        assert too_big.status_code == 422 and "only 4 GPUs per node" in too_big.text
        # The CLI asks first (POST /v1/jobs/check): exit 1 with the reason, and nothing is submitted.
        refusals = ((("--gpus", "8"), "only 4 GPUs per node"), (("--label", "pool=nowhere"), "pool dev, not nowhere"))
        for args, reason in refusals:
            refused = cluster.cli("submit", *args, "--", "true")
            out = refused.stdout + refused.stderr
            assert refused.returncode == 1 and "not submitted" in out and reason in out, out
            assert "submitted job" not in out, out
        fits = httpx.post(scheduler.url + "/v1/jobs/check", json={"name": "small", "command": ["true"], "gpus": 2})
        assert fits.status_code == 200 and fits.json() == {"feasible": True, "reason": None}
        bad = httpx.post(scheduler.url + "/v1/jobs/check", json={"name": "x", "command": ["true"], "gpus": 0})
        assert bad.status_code == 422 and "gpus" in bad.text

        def submit(*args: str, steps: int) -> str:
            out = cluster.cli("submit", "--gpus", *args, "--", sys.executable, str(script), str(steps), str(gate))
            assert out.returncode == 0, out.stdout + out.stderr
            return out.stdout.split("submitted job ")[1].split()[0]

        low = submit("4", "--priority", "low", "--preemptible", "--team", "research", steps=60)
        wait_until(lambda: _job(scheduler, low)["state"] == "running", what="low-priority job running")
        wait_until(lambda: _checkpoint(tmp_path, low) >= 5, what="low-priority job checkpointed")

        waiter = submit("2", "--team", "research", steps=3)
        why = wait_until(lambda: "needs 2 GPUs" in (w := cluster.cli("jobs", "why", waiter).stdout) and w, what="why")
        assert "on one node" in why and "first in line" in why

        high = submit("4", "--priority", "high", "--team", "prod", steps=5)
        # The gate stays shut until the low job has been preempted: `high` and `waiter` pass it at once.
        wait_until(lambda: "sigterm at" in (tmp_path / "home" / "jobs" / f"{low}.1.log").read_text(), timeout=60,
                   what="low-priority job stopped")
        gate.touch()
        done = wait_until(lambda: _job(scheduler, high)["state"] == "succeeded" and _job(scheduler, high), timeout=60,
                          what="high-priority job done")
        assert done["attempt"] == 1

        for job_id in (low, waiter):
            wait_until(lambda job_id=job_id: _job(scheduler, job_id)["state"] == "succeeded", timeout=90,
                       what=f"{job_id} done")
        assert _job(scheduler, low)["attempt"] == 2 and _job(scheduler, waiter)["attempt"] == 1
        logs = cluster.cli("jobs", "logs", low)
        assert logs.returncode == 0 and "attempt=2 resume=1" in logs.stdout
        resumed_from = int(logs.stdout.split("from=")[1].split()[0])
        # It went on from its checkpoint (past its 60 steps if the gate held it there) and ended at once there.
        assert resumed_from >= 5 and f"done at {max(60, resumed_from)}" in logs.stdout, logs.stdout
        assert "requeued: attempt 1 on r4090-01" in cluster.cli("jobs", "why", low).stdout

        history = asyncio.run(_job_history(clean_servers))
        # The refused submissions never reached the bus.
        assert sorted(e.job_id for e in history if isinstance(e, JobSubmitted)) == sorted([low, waiter, high])
        preempted = [(e.job_id, e.attempt, e.grace_s) for e in history if isinstance(e, JobPreempted)]
        assert preempted == [(low, 1, 3)], preempted
        [requeued] = [e for e in history if isinstance(e, JobRequeued)]
        assert requeued.cause == "preempted" and f"preempted for high job {high}" in requeued.reason
    finally:
        cluster.stop()
