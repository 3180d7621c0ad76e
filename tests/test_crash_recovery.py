"""kill -9 the scheduler and billing while jobs are submitted: every job placed once, charged once."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from decimal import Decimal

import httpx

from whaleflux.billing.pricing import gpu_seconds
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted, JobSubmitted, decode

from .processes import fetch_stored, make_cluster, wait_until

JOBS = 40


async def _connect(servers) -> Bus:
    return await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)


async def _submit(servers, ids: list[str], milestones: dict[int, threading.Event] | None = None,
                  resume: dict[int, threading.Event] | None = None) -> None:
    """Publish the jobs one by one; after the n-th, set `milestones[n]` and, if `resume[n]` is given, wait
    for it, so that a test can kill and restart services at a known point of the stream."""
    bus = await _connect(servers)
    try:
        for n, job_id in enumerate(ids, 1):
            cmd = ["python", "-c", "import time; time.sleep(0.3)"]
            await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(job_id=job_id, name=job_id, team="t", command=cmd),
                              subject=job_id)
            if milestones and n in milestones:
                milestones[n].set()
            if resume and n in resume:
                await asyncio.to_thread(resume[n].wait, 120)
            await asyncio.sleep(0.05)
    finally:
        await bus.close()


async def _job_history(servers) -> list:
    """Every event on the JOBS stream, decoded."""
    bus = await _connect(servers)
    try:
        sub = await bus.js.pull_subscribe("job.>", durable="test-history", stream="WHALEFLUX_JOBS")
        out = []
        for m in await fetch_stored(sub):
            out.append(decode(m.data)[1])
            await m.ack()
        return out
    finally:
        await bus.close()


def test_kill_9_scheduler_and_billing_mid_stream_places_and_charges_each_job_once(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    billing = cluster.service("billing")
    cluster.agent("a100-01", "h100-01")
    ids = [f"crash-{i:03d}" for i in range(JOBS)]
    try:
        scheduler.wait_ready()
        billing.wait_ready()
        wait_until(lambda: len(httpx.get(scheduler.url + "/v1/nodes").json()) == 2, what="nodes registered")

        # Both services are killed after the 10th submission; submissions go on while they are down (the
        # submitter waits after the 15th until the scheduler is back), and billing comes back after the 25th.
        killed, down, scheduler_back, billing_due = (threading.Event() for _ in range(4))
        milestones, resume = {10: killed, 25: billing_due}, {10: down, 15: scheduler_back}
        submitter = threading.Thread(target=lambda: asyncio.run(
            _submit(clean_servers, ids, milestones=milestones, resume=resume)))
        submitter.start()
        assert killed.wait(60)
        scheduler.kill9()
        billing.kill9()
        down.set()
        scheduler.start().wait_ready(60)  # same command, same port
        scheduler_back.set()
        assert billing_due.wait(60)
        billing.start().wait_ready(60)
        submitter.join()

        def all_done():
            jobs = httpx.get(scheduler.url + "/v1/jobs", params={"limit": 1000}).json()
            return len(jobs) == JOBS and all(j["state"] == "succeeded" for j in jobs) and jobs
        jobs = wait_until(all_done, timeout=90, what="all jobs succeeded")
        assert all(j["attempt"] == 1 for j in jobs)

        history = asyncio.run(_job_history(clean_servers))
        placed = Counter(e.job_id for e in history if isinstance(e, JobPlaced))
        started = Counter(e.job_id for e in history if isinstance(e, JobStarted))
        assert placed == Counter({i: 1 for i in ids}), "each job placed exactly once"
        assert started == Counter({i: 1 for i in ids}), "each job ran exactly once"

        finished = {e.job_id: e for e in history if isinstance(e, JobFinished)}
        def charged():
            rows = httpx.get(billing.url + "/v1/costs", params={"by": "job"}).json()["rows"]
            return len(rows) == JOBS and rows
        rows = wait_until(charged, timeout=30, what="every job charged")
        assert all(r["jobs"] == 1 for r in rows)
        for job_id in ids:
            [usage] = httpx.get(f"{billing.url}/v1/costs/jobs/{job_id}").json()
            f = finished[job_id]
            assert Decimal(usage["gpu_seconds"]) == gpu_seconds(f.started_at, f.finished_at, 1)
    finally:
        cluster.stop()


async def _drop_keys(servers, pattern: str) -> int:
    from redis.asyncio import Redis

    redis = Redis.from_url(servers.redis_url, password=servers.redis_password)
    keys = [k async for k in redis.scan_iter(match=pattern)]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()
    return len(keys)


def test_billing_rebuilds_identical_totals_by_replay_after_losing_its_redis_state(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    billing = cluster.service("billing")
    cluster.agent("r4090-01")
    ids = [f"replay-{i}" for i in range(6)]
    try:
        scheduler.wait_ready()
        billing.wait_ready()
        wait_until(lambda: httpx.get(scheduler.url + "/v1/nodes").json(), what="node registered")
        asyncio.run(_submit(clean_servers, ids))

        def charged():
            report = httpx.get(billing.url + "/v1/costs", params={"by": "job"}).json()
            return len(report["rows"]) == len(ids) and report
        before = wait_until(charged, timeout=60, what="all jobs charged")

        billing.stop()
        assert asyncio.run(_drop_keys(clean_servers, "wf:billing:*")) > 0
        billing.start().wait_ready()
        after = wait_until(charged, timeout=30, what="totals rebuilt")
        assert after["rows"] == before["rows"] and after["total_usd"] == before["total_usd"]
        assert "state.replaying" in billing.log_path.read_text()
    finally:
        cluster.stop()
