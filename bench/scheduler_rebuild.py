"""Scheduler rebuild after a lost store, with a long job history: `python bench/scheduler_rebuild.py [--jobs 100000]`.

Starts its own nats-server and redis-server (pip wheels), writes a history of
`--jobs` jobs spread over the last 30 days onto the JOBS stream (submitted,
placed, started, finished for most; 5% still running, 5% pending), then times,
against an empty Redis, the scheduler's whole rebuild (read, fold every job,
write records, queue and allocations, move the consumer) from the stream
alone, and beside it, in the same run, the time to only read the stream once
(the floor of any rebuild from the stream). Then the leader's background
snapshot (the fold, less jobs ended more than 7 days ago), 1% more jobs on the
stream, and the rebuild again: from the snapshot plus that tail.
Target: rebuild <= 30 s for 100,000 jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redis.asyncio import Redis

from whaleflux.scheduler.leadership import Leadership
from whaleflux.scheduler.rebuild import JOB_HISTORY, read_stream, rebuild, snapshot
from whaleflux.scheduler.store import SchedulerStore
from whaleflux.servers import LocalServers
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted, JobSubmitted, encode, make_envelope
from whaleflux.shared.outbox import Outbox

SPAN = timedelta(days=30)
KEEP_FINISHED_S = 7 * 86400.0


def history(jobs: int, first: int = 0, end: datetime | None = None):
    """Every job's events in order, spread over the 30 days before `end`: 90% finished, 5% running, 5% pending."""
    end = end or datetime.now(UTC)
    for i in range(first, first + jobs):
        job_id = f"bench-{i:07d}"
        t = end - SPAN + SPAN * ((i - first) / jobs)
        yield (
            subjects.JOB_SUBMITTED,
            make_envelope(
                JobSubmitted(
                    job_id=job_id, name=job_id, team=f"team-{i % 7}", command=["python", "train.py", "--step", str(i)]
                ),
                source="bench",
                time=t,
            ),
        )
        if i % 20 == 19:
            continue  # pending
        node, gpu = f"node-{i % 64:02d}", f"GPU-{i % 64:02d}-{i % 8}"
        placed = JobPlaced(
            job_id=job_id,
            attempt=1,
            cluster="c",
            node=node,
            gpu_model="H100",
            gpu_uuids=[gpu],
            gpu_indices=[i % 8],
            command=["python", "train.py"],
            team="t",
            project="p",
        )
        yield subjects.job_placed("c", node), make_envelope(placed, source="bench", time=t)
        yield (
            subjects.job_started("c", node),
            make_envelope(
                JobStarted(
                    job_id=job_id, attempt=1, cluster="c", node=node, gpu_uuids=[gpu], pid=1000 + i, started_at=t
                ),
                source="bench",
                time=t,
            ),
        )
        if i % 20 == 18:
            continue  # running
        done = t + timedelta(seconds=30)
        yield (
            subjects.job_finished("c", node),
            make_envelope(
                JobFinished(
                    job_id=job_id, attempt=1, cluster="c", node=node, exit_code=0, started_at=t, finished_at=done
                ),
                source="bench",
                time=done,
            ),
        )


async def fill(bus: Bus, jobs: int, first: int = 0) -> int:
    """Publish the history without waiting for each ack (core NATS into the stream), then wait until it is stored."""
    n, before = 0, (await bus.js.stream_info("WHALEFLUX_JOBS")).state.messages
    for subject, env in history(jobs, first):
        await bus.nc.publish(subject, encode(env))
        n += 1
        if n % 20000 == 0:
            await bus.nc.flush()
    await bus.nc.flush()
    while (await bus.js.stream_info("WHALEFLUX_JOBS")).state.messages < before + n:  # noqa: ASYNC110 - polls the server
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
            print(
                f"history: {jobs:,} jobs, {events:,} events on the JOBS stream "
                f"(written in {time.perf_counter() - t:.1f} s)"
            )

            t = time.perf_counter()
            read = sum([1 async for _ in read_stream(bus, "WHALEFLUX_JOBS", JOB_HISTORY)])
            read_s = time.perf_counter() - t

            leadership = Leadership(redis, "wf:scheduler", "bench", 30)
            await leadership.acquire(0.1)
            store = SchedulerStore(
                redis, "wf:scheduler", Outbox(redis, "wf:scheduler"), "bench", leadership, lambda: "bench"
            )
            t = time.perf_counter()
            done = await rebuild(bus, store, hold_s=15.0, max_restarts=3, now=datetime.now(UTC))
            rebuild_s = time.perf_counter() - t
            print(f"read the stream once (reference): {read:,} events in {read_s:.1f} s")
            print(
                f"scheduler rebuild from the stream alone: {rebuild_s:.1f} s for {done.jobs:,} jobs "
                f"({done.events:,} events; "
                f"{done.pending:,} pending, {done.active:,} running) — target <= 30 s for 100,000 jobs"
            )

            t = time.perf_counter()
            seq, kept = await snapshot(bus, 15.0, 3, datetime.now(UTC), KEEP_FINISHED_S)
            print(
                f"background snapshot (leader, every 5 min): {time.perf_counter() - t:.1f} s, {kept:,} jobs kept "
                f"(live + ended within 7 days) as of sequence {seq:,}"
            )
            tail = await fill(bus, max(jobs // 100, 1), first=jobs)
            await redis.flushdb()
            await leadership.acquire(0.1)
            t = time.perf_counter()
            done = await rebuild(bus, store, hold_s=15.0, max_restarts=3, now=datetime.now(UTC))
            print(
                f"scheduler rebuild from the snapshot + a tail of {tail:,} events: {time.perf_counter() - t:.1f} s "
                f"({done.jobs:,} jobs restored, {done.pending:,} pending, {done.active:,} running)"
            )
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
