#!/usr/bin/env python3
"""Benchmark: job events per second through the real billing service (NATS JetStream + Redis).

`bench/billing_ledger.py` measures the ledger core alone; this one measures the
whole path: a backlog of job.placed / job.started / job.finished events on the
JOBS stream, consumed by one in-process billing service (durable pull consumer
in batches of 256: one pipelined read per batch, decided in stream order, one
MULTI write, acks after it), timed until every usage record is written.
Printed beside the same run's reference: the same backlog fetched and acked by
a bare pull consumer in batches of 256 with no handling, with the fetch every
consumer of the bus uses (`shared/pull.py`: what the bus alone costs), and again
with nats-py's own `PullSubscription.fetch` (what the bus used before). The
service is timed from its start() returning (connected, state checked,
consumers created), the references from their subscriptions; each prints its
CPU time per event in this process (on a shared, loaded machine steadier than
the rate). Starts its own nats-server and redis-server.

    python bench/billing_service_ingest.py [--jobs 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime, timedelta

import nats.js.errors
from telemetry_harness import server_env, start_servers

from whaleflux.billing.app import BillingSettings, build
from whaleflux.servers import LocalServers
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted
from whaleflux.shared.logs import configure_logging
from whaleflux.shared.pull import Puller

TARGET = 20_000
BAR = 5_000


async def publish_job_events(bus: Bus, jobs: int, prefix: str) -> None:
    """placed / started / finished of `jobs` 30-minute jobs on 64 nodes, 1-4 GPUs each (also bench/capacity.py's)."""
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    for i in range(jobs):
        job, node, gpus = f"{prefix}{i:06d}", f"n{i % 64:02d}", [f"GPU-{i % 64:02d}-{g}" for g in range(i % 4 + 1)]
        start = t0 + timedelta(minutes=i)
        await bus.publish(subjects.job_placed("c1", node), JobPlaced(
            job_id=job, attempt=1, cluster="c1", node=node, gpu_model="H100", gpu_uuids=gpus,
            gpu_indices=list(range(len(gpus))), command=["x"], team=f"t{i % 8}", project="p"), time=start)
        await bus.publish(subjects.job_started("c1", node), JobStarted(
            job_id=job, attempt=1, cluster="c1", node=node, gpu_uuids=gpus, pid=1, started_at=start))
        await bus.publish(subjects.job_finished("c1", node), JobFinished(
            job_id=job, attempt=1, cluster="c1", node=node, exit_code=0, started_at=start,
            finished_at=start + timedelta(minutes=30)))


async def run(jobs: int, servers: LocalServers) -> None:
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    await bus.ensure_streams()
    await publish_job_events(bus, jobs, prefix="b")
    await bus.close()

    reference, reference_cpu = await bare_consume(servers, jobs * 3)
    natspy, natspy_cpu = await bare_consume(servers, jobs * 3, natspy=True)
    _, svc = build(BillingSettings(inventory_url="http://127.0.0.1:9"))
    await svc.runtime.start()
    try:
        began, began_cpu = time.perf_counter(), time.process_time()  # connected and started: consumers created
        js = svc.runtime.bus.js
        deadline = began + 600  # a stalled consumer fails the run instead of hanging it
        while True:  # the consumer's backlog and unacked events both drained (acks come after the writes)
            assert time.perf_counter() < deadline, "no end in 600 s: the consumer stalled"
            try:
                info = await js.consumer_info("WHALEFLUX_JOBS", "billing-jobs")
            except nats.js.errors.NotFoundError:  # not created yet
                await asyncio.sleep(0.01)
                continue
            if info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq >= jobs * 3:
                break
            await asyncio.sleep(0.02)
        elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu
        ended = sum(r.ended_at is not None for r in await svc.store.all_usage_records())
        assert ended == jobs, f"{ended} of {jobs} usage records ended"
    finally:
        await svc.runtime.stop()
    events = jobs * 3
    print(f"billing service ingest: {events} job events in {elapsed:.2f} s = {events / elapsed:,.0f} events/s "
          f"(target >= {TARGET:,}/s, bar {BAR:,}/s), {cpu / events * 1e6:.0f} us CPU per event in this process; "
          f"reference, same run: fetch + ack alone {events / reference:,.0f} events/s, "
          f"{reference_cpu / events * 1e6:.0f} us CPU per event; the same with nats-py's fetch "
          f"{events / natspy:,.0f} events/s, {natspy_cpu / events * 1e6:.0f} us CPU per event")


async def bare_consume(servers: LocalServers, events: int, natspy: bool = False) -> tuple[float, float]:
    """Seconds, and CPU seconds of this process, for a bare pull consumer to fetch and ack `events` job events
    in batches of 256, each acked (as the service does): with the bus's `Puller`, or with `natspy` nats-py's
    `PullSubscription.fetch`."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    js = nc.jetstream()
    durable = f"bench-reference{'-natspy' if natspy else ''}"
    config = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1000,
                            filter_subject="job.>")
    await js.add_consumer("WHALEFLUX_JOBS", config)
    sub: Puller | nats.js.JetStreamContext.PullSubscription
    if natspy:
        sub = await js.pull_subscribe_bind(durable=durable, stream="WHALEFLUX_JOBS")
    else:
        sub = Puller(nc, "WHALEFLUX_JOBS", durable)
        await sub.bind()
    began, began_cpu = time.perf_counter(), time.process_time()
    got = 0
    while got < events:
        msgs = await sub.fetch(256, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    await nc.close()
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    servers = start_servers()
    os.environ.update(server_env(servers))  # the in-process service reads them
    configure_logging("billing", "warning")  # as the service runs, minus per-event info lines
    try:
        asyncio.run(run(args.jobs, servers))
    finally:
        servers.stop()


if __name__ == "__main__":
    main()
