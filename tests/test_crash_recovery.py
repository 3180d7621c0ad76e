"""kill -9 the scheduler and billing while jobs are submitted: every job placed once, charged once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from decimal import Decimal

import httpx

from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted, JobSubmitted, decode
from whaleflux.billing.pricing import gpu_seconds

from .processes import make_cluster, wait_until

JOBS = 40


async def _connect(servers) -> Bus:
    return await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)


async def _submit(servers, ids: list[str]) -> None:
    bus = await _connect(servers)
    try:
        for job_id in ids:
            cmd = ["python", "-c", "import time; time.sleep(0.3)"]
            await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(job_id=job_id, name=job_id, team="t", command=cmd),
                              subject=job_id)
            await asyncio.sleep(0.05)
    finally:
        await bus.close()


async def _job_history(servers) -> list:
    """Every event on the JOBS stream, decoded."""
    bus = await _connect(servers)
    try:
        sub = await bus.js.pull_subscribe("job.>", durable="test-history", stream="WHALEFLUX_JOBS")
        out = []
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1)
            except Exception:
                break
            for m in msgs:
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

        # Submissions keep arriving for ~2 s while both services are killed and restarted.
        submitter = threading.Thread(target=lambda: asyncio.run(_submit(clean_servers, ids)))
        submitter.start()
        time.sleep(0.7)
        scheduler.kill9()
        billing.kill9()
        time.sleep(0.3)
        scheduler.start().wait_ready()  # same command, same port
        time.sleep(0.5)
        billing.start().wait_ready()
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
