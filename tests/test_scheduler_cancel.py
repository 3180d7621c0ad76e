"""Cancelling jobs through the running services: `POST /v1/jobs/{id}/cancel` and `whaleflux jobs cancel`.

Real NATS and Redis, scheduler and billing processes and a simulated agent process (r4090-01, 4 GPUs); the
jobs are real processes that mark their own start, end and SIGTERM. A pending job leaves the queue; a running
one is stopped on its node and ends `cancelled` (not failed), is charged what it ran, and is never placed
again: not by a later pass, not after the scheduler restarts on a wiped store and rebuilds from the stream.
"""

from __future__ import annotations

import time

import httpx
import redis

from whaleflux.scheduler.history import fold
from whaleflux.scheduler.transitions import cancel
from whaleflux.shared.events import JobCancelled, JobPreempted

from .lifecycle import AUTH, assert_billed_what_ran, runs, start_stack, submit
from .processes import wait_until
from .test_job_history import at, ev, finished, placed, started, submitted


def test_the_history_folds_a_cancel_and_nothing_after_it_revives_the_job():
    cancelled = JobCancelled(job_id="j1", attempt=1, reason="not needed", cancelled_by="api")
    jobs = fold([ev(0, submitted()), ev(1, placed()), ev(2, started()), ev(3, cancelled),
                 ev(4, finished(code=143, t0=2, t1=4)), ev(5, placed(attempt=2))], hold_s=15, max_restarts=3)
    job = jobs["j1"]
    assert (job.state, job.reason, job.attempt, job.finished_at) == ("cancelled", "cancelled: not needed", 1, at(3))
    # The same job cancelled while pending, and live: the same record, and what it announces.
    [pending] = fold([ev(0, submitted())], hold_s=15, max_restarts=3).values()
    [announced] = cancel(pending, "not needed", "api", 5.0, at(3))
    assert pending.state == "cancelled" and announced.subject == "job.cancelled"
    assert announced.event_id == "cancelled-j1" and cancel(pending, "again", "api", 5.0, at(4)) == []
    [running] = fold([ev(0, submitted()), ev(1, placed()), ev(2, started())], hold_s=15, max_restarts=3).values()
    stop, done = cancel(running, "not needed", "api", 5.0, at(3))
    assert (stop.subject, stop.event_id) == ("job.preempted.c.n1", "cancel-j1-1")
    assert stop.data == JobPreempted(job_id="j1", attempt=1, cluster="c", node="n1", reason="cancelled: not needed",
                                     grace_s=5.0)
    assert done.data == JobCancelled(job_id="j1", attempt=1, reason="not needed", cancelled_by="api")


def _job(url: str, job_id: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()


def _cancel(url: str, job_id: str, **body: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/jobs/{job_id}/cancel", json=body or None, headers=AUTH, timeout=10)


def test_cancel_pending_and_running_jobs_which_stay_cancelled_across_a_rebuild(clean_servers, tmp_path):
    grace = {"WHALEFLUX_PREEMPTION_GRACE_S": "3", "WHALEFLUX_PASS_INTERVAL_S": "0.3"}
    cluster, scheduler, billing = start_stack(clean_servers, tmp_path, "r4090-01", **grace)
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        [running] = submit(scheduler.url, marks, 300, 1)
        wait_until(lambda: _job(scheduler.url, running)["state"] == "running" and runs(marks, running),
                   what="the long job running")
        # Needs the whole node while one GPU is held: it waits.
        [waiting] = submit(scheduler.url, marks, 1, 1, gpus=4)
        wait_until(lambda: "needs 4 GPUs" in (_job(scheduler.url, waiting).get("reason") or ""), what="waiting")

        # Bad requests: no token, unknown job, an empty reason.
        assert httpx.post(f"{scheduler.url}/v1/jobs/{waiting}/cancel", timeout=10).status_code == 401
        assert _cancel(scheduler.url, "no-such-job").status_code == 404
        empty = _cancel(scheduler.url, waiting, reason="")
        assert empty.status_code == 422 and "reason" in empty.text

        # A pending job: out of the queue, cancelled before it ran.
        out = _cancel(scheduler.url, waiting, reason="not needed")
        assert out.status_code == 200, out.text
        assert out.json() == {"job_id": waiting, "state": "cancelled", "was": "pending", "attempt": 0, "stopping": []}
        assert _job(scheduler.url, waiting)["reason"] == "cancelled: not needed"
        why = cluster.cli("jobs", "why", waiting)
        assert "cancelled before it ran: not needed" in why.stdout, why.stdout

        # A running job, through the CLI: stopped on its node (SIGTERM), cancelled, not failed. It runs a while
        # first, so that what billing charges can be compared with what it ran within 1 %.
        wait_until(lambda: time.time() - runs(marks, running)[0].start > 8, what="the long job ran 8 s")
        cli = cluster.cli("jobs", "cancel", running, "--reason", "wrong data")
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert "cancelled (was running, attempt 1); stopping it on r4090-01" in cli.stdout
        wait_until(lambda: runs(marks, running)[-1].stopped, timeout=60, what="the running job got SIGTERM")
        record = _job(scheduler.url, running)
        assert record["state"] == "cancelled" and record["reason"] == "cancelled: wrong data", record
        again = _cancel(scheduler.url, running)
        assert again.status_code == 409 and "has ended already: cancelled" in again.text
        assert_billed_what_ran(billing.url, marks, [running])

        # Its GPUs are free again, and a later job runs on them; the cancelled ones are never placed again.
        [later] = submit(scheduler.url, marks, 0.2, 1, gpus=4)
        wait_until(lambda: _job(scheduler.url, later)["state"] == "succeeded", timeout=60, what="a later job ran")
        assert not runs(marks, waiting) and len(runs(marks, running)) == 1

        # The scheduler dies with its store wiped: the rebuild from the stream keeps both cancelled.
        scheduler.kill9()
        redis.Redis.from_url(clean_servers.redis_url, password=clean_servers.redis_password).flushdb()
        scheduler = cluster.service("scheduler", **grace)
        scheduler.wait_ready()
        for job_id, attempt in ((waiting, 0), (running, 1)):
            rebuilt = wait_until(lambda job_id=job_id: (r := httpx.get(f"{scheduler.url}/v1/jobs/{job_id}",
                                                                       timeout=10)).status_code == 200 and r.json(),
                                 what=f"{job_id} rebuilt")
            assert rebuilt["state"] == "cancelled" and rebuilt["attempt"] == attempt, rebuilt
        [after] = submit(scheduler.url, marks, 0.2, 1, gpus=4)
        wait_until(lambda: _job(scheduler.url, after)["state"] == "succeeded", timeout=60, what="a job after rebuild")
        assert not runs(marks, waiting) and len(runs(marks, running)) == 1
    finally:
        cluster.stop()
