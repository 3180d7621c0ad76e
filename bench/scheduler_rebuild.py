"""Scheduler rebuild after a lost store, with a long job history: `python bench/scheduler_rebuild.py [--jobs 100000]`.

Starts its own nats-server and redis-server (pip wheels), writes a history of
`--jobs` jobs onto the JOBS stream (submitted, placed, started, finished for
most; a tail still running and a tail still pending), then times, against an
empty Redis, the scheduler's whole rebuild (read the stream, fold every job,
write records, queue and allocations, move the consumer), and beside it, in
the same run, the time to only read the stream once (the floor any rebuild
from the stream pays). Target: rebuild <= 30 s for 100,000 jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from redis.asyncio import Redis

from whaleflux.scheduler.leadership import Leadership
from whaleflux.scheduler.rebuild import JOB_HISTORY, read_stream, rebuild
from whaleflux.scheduler.store import SchedulerStore
from whaleflux.servers import LocalServers
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted, JobSubmitted, encode, make_envelope
from whaleflux.shared.outbox import Outbox

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def history(jobs: int):
    """Every job's events in order: 90% finished, 5% running, 5% pending."""
    for i in range(jobs):
        job_id = f"bench-{i:07d}"
        t = T0 + timedelta(seconds=i)
        yield subjects.JOB_SUBMITTED, make_envelope(
            JobSubmitted(job_id=job_id, name=job_id, team=f"team-{i % 7}", command=["python", "train.py", "--step", str(i)]),
            source="bench", time=t)
        if i % 20 == 19:
            continue  # pending
        node, gpu = f"node-{i % 64:02d}", f"GPU-{i % 64:02d}-{i % 8}"
        placed = JobPlaced(job_id=job_id, attempt=1, cluster="c", node=node, gpu_model="H100", gpu_uuids=[gpu],
                           gpu_indices=[i % 8], command=["python", "train.py"], team="t", project="p")
        yield subjects.job_placed("c", node), make_envelope(placed, source="bench", time=t)
        yield subjects.JOB_STARTED, make_envelope(JobStarted(job_id=job_id, attempt=1, cluster="c", node=node,
                                                             gpu_uuids=[gpu], pid=1000 + i, started_at=t), source="bench", time=t)
        if i % 20 == 18:
            continue  # running
        end = t + timedelta(seconds=30)
        yield subjects.JOB_FINISHED, make_envelope(JobFinished(job_id=job_id, attempt=1, cluster="c", node=node, exit_code=0,
                                                               started_at=t, finished_at=end), source="bench", time=end)


async def fill(bus: Bus, jobs: int) -> int:
    """Publish the history without waiting for each ack (core NATS into the stream), then wait until it is stored."""
    n = 0
    for subject, env in history(jobs):
        await bus.nc.publish(subject, encode(env))
        n += 1
        if n % 20000 == 0:
            await bus.nc.flush()
    await bus.nc.flush()
    while (await bus.js.stream_info("WHALEFLUX_JOBS")).state.messages < n:
        await asyncio.sleep(0.2)
    return n


async def main(jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalServers(Path(tmp), "bench", secrets.token_urlsafe(12), secrets.token_urlsafe(12)).start()
        try:
            bus = await Bus.connect(local.nats_url, source="bench", user=local.nats_user, password=local.nats_password)
            await bus.ensure_streams()
            redis = Redis.from_url(local.redis_url, password=local.redis_password, decode_responses=True)
            t = time.perf_counter()
            events = await fill(bus, jobs)
            print(f"history: {jobs:,} jobs, {events:,} events on the JOBS stream (written in {time.perf_counter() - t:.1f} s)")

            t = time.perf_counter()
            read = sum([1 async for _ in read_stream(bus, "WHALEFLUX_JOBS", JOB_HISTORY)])
            read_s = time.perf_counter() - t

            leadership = Leadership(redis, "wf:scheduler", "bench", 30)
            await leadership.acquire(0.1)
            store = SchedulerStore(redis, "wf:scheduler", Outbox(redis, "wf:scheduler"), "bench", leadership, lambda: "bench")
            t = time.perf_counter()
            done = await rebuild(bus, redis, store, hold_s=15.0, max_restarts=3, now=datetime.now(timezone.utc))
            rebuild_s = time.perf_counter() - t
            print(f"read the stream once (reference): {read:,} events in {read_s:.1f} s")
            print(f"scheduler rebuild: {rebuild_s:.1f} s for {done.jobs:,} jobs ({done.events:,} events; "
                  f"{done.pending:,} pending, {done.active:,} running) — target <= 30 s for 100,000 jobs")
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cpus: {os.cpu_count()}")
            await redis.aclose()
            await bus.close()
        finally:
            local.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.jobs)))
