"""Billing's batched ingest of job events through real NATS and Redis: a bad event in a fetch costs only
itself, and a kill -9 between a batch's write and its acks charges nothing twice."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
from redis.asyncio import Redis

from whaleflux.billing.app import BillingSettings, build
from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted

from .holding_proxy import HoldingProxy
from .processes import connect_bus, make_cluster, until, wait_until
from .test_bus import deadletters

T0 = datetime(2026, 3, 1, tzinfo=UTC)
STREAM, DURABLE = "WHALEFLUX_JOBS", "billing-jobs"


def _gpus(i: int) -> int:
    return i % 4 + 1


def _expected_gpu_seconds(i: int) -> Decimal:
    return Decimal(1800 * _gpus(i))  # every job runs 30 minutes


async def _publish_jobs(bus, jobs: int, bad_after: int | None = None) -> None:
    """placed / started / finished of `jobs` 30-minute jobs a minute apart on 64 nodes (no GPU is held twice
    at once), in that order: job i's finish is stream sequence 3i+3 on an empty stream. `bad_after`: one message
    that is no event, after that job's start."""
    for i in range(jobs):
        job, node = f"j{i:05d}", f"n{i % 64:02d}"
        gpus = [f"GPU-{node}-{g}" for g in range(_gpus(i))]
        start = T0 + timedelta(minutes=i)
        await bus.publish(subjects.job_placed("c1", node), JobPlaced(
            job_id=job, attempt=1, cluster="c1", node=node, gpu_model="H100", gpu_uuids=gpus,
            gpu_indices=list(range(len(gpus))), command=["x"], team=f"t{i % 4}", project="p"), time=start)
        await bus.publish(subjects.JOB_STARTED, JobStarted(
            job_id=job, attempt=1, cluster="c1", node=node, gpu_uuids=gpus, pid=1, started_at=start))
        if i == bad_after:
            await bus.js.publish(subjects.JOB_FINISHED, json.dumps({"specversion": "1.0", "type": "?"}).encode())
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id=job, attempt=1, cluster="c1", node=node, exit_code=0, started_at=start,
            finished_at=start + timedelta(minutes=30)))


async def _records(servers) -> dict[str, dict]:
    """The usage records billing keeps (ledger key -> record), as stored."""
    redis = Redis.from_url(servers.redis_url, password=servers.redis_password)
    try:
        raw = await redis.hgetall("wf:billing:usage")
    finally:
        await redis.aclose()
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}


def _assert_each_job_charged_once(records: dict[str, dict], jobs: int) -> None:
    assert sorted(records) == [f"j{i:05d}:1" for i in range(jobs)]  # one record per job, no other
    for i in range(jobs):
        record = records[f"j{i:05d}:1"]
        assert record["state"] == "finished"
        assert Decimal(record["gpu_seconds"]) == _expected_gpu_seconds(i), record


async def test_a_fetch_with_one_bad_event_dead_letters_it_and_charges_every_other_job_once(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", "http://127.0.0.1:9")
    jobs = 40
    bus = await connect_bus(env)
    # In the stream before billing starts: the 121 messages come in one fetch (batches of 256).
    await _publish_jobs(bus, jobs, bad_after=17)
    _, svc = build(BillingSettings())
    await svc.runtime.start()
    try:
        async def all_ended():
            records = await _records(env)
            return len(records) == jobs and all(r["ended_at"] for r in records.values()) and records
        records = await until(all_ended, timeout=60, what="every job's usage ended")
        _assert_each_job_charged_once(records, jobs)

        [dead] = await deadletters(bus, 1)
        assert dead.headers["WhaleFlux-Consumer"] == DURABLE and dead.headers["WhaleFlux-Stage"] == "validation"
        assert dead.headers["WhaleFlux-Subject"] == subjects.JOB_FINISHED and dead.headers[REASON_HEADER]

        async def settled():
            info = await bus.js.consumer_info(STREAM, DURABLE)
            return info.num_pending == 0 and info.num_ack_pending == 0 and info
        info = await until(settled, timeout=30, what="every event acked or terminated")
        assert info.num_redelivered == 0  # nothing was retried: the bad event cost only itself
        assert svc.runtime.bus.metrics.deadlettered.labels(DURABLE, "validation")._value.get() == 1
    finally:
        await svc.runtime.stop()
        await bus.close()


async def _written_not_acked(servers) -> tuple[int, int]:
    """(jobs whose end is written but whose job.finished is not acked yet, events delivered and unacked)."""
    bus = await connect_bus(servers)
    try:
        info = await bus.js.consumer_info(STREAM, DURABLE)
    finally:
        await bus.close()
    floor = info.ack_floor.stream_seq
    records = await _records(servers)
    ahead = sum(1 for key, r in records.items() if r["ended_at"] and 3 * int(key[1:6]) + 3 > floor)
    return ahead, info.num_ack_pending


def _stable_count(servers) -> int:
    """The number of usage records once it stopped changing (billing finished what it had in hand)."""
    counts = [len(asyncio.run(_records(servers)))]
    while True:
        time.sleep(0.3)
        counts.append(len(asyncio.run(_records(servers))))
        if counts[-1] == counts[-2] == counts[-3 if len(counts) > 2 else -2]:
            return counts[-1]


def test_kill_9_between_a_batchs_write_and_its_acks_charges_each_job_once(clean_servers, tmp_path):
    jobs = 2000

    async def backlog():
        bus = await connect_bus(clean_servers)
        try:
            await _publish_jobs(bus, jobs)
        finally:
            await bus.close()
    asyncio.run(backlog())
    proxy = HoldingProxy(clean_servers.nats_url)
    cluster = make_cluster(clean_servers, tmp_path)
    try:
        billing = cluster.service("billing", WHALEFLUX_INVENTORY_URL="http://127.0.0.1:9", NATS_URL=proxy.url)
        wait_until(lambda: asyncio.run(_records(clean_servers)), timeout=120, what="billing ingesting")
        # Hold what billing sends to NATS: the batch in hand is written to Redis and its acks wait here.
        # (If it had none in hand, let it run a moment and hold again.)
        for _ in range(50):
            proxy.hold()
            count = _stable_count(clean_servers)
            ahead, unacked = asyncio.run(_written_not_acked(clean_servers))
            if ahead:
                break
            assert count < jobs, "ingest ended before billing was caught with a batch in hand"
            proxy.release()
            wait_until(lambda c=count: len(asyncio.run(_records(clean_servers))) > c, what="ingest going on")
        assert ahead and unacked, "never caught billing between a write and its acks"
        billing.kill9()
        proxy.drop()  # the acks die with the process

        billing.start().wait_ready()

        def all_ended():
            records = asyncio.run(_records(clean_servers))
            return len(records) == jobs and all(r["ended_at"] for r in records.values()) and records
        # The dead process's unacked events come again after their ack_wait and are written again, the same.
        records = wait_until(all_ended, timeout=180, interval=0.5, what="every job's usage ended")
        _assert_each_job_charged_once(records, jobs)
        wait_until(lambda: asyncio.run(_written_not_acked(clean_servers)) == (0, 0), timeout=60,
                   what="every event acked")

        report = httpx.get(billing.url + "/v1/costs", params={"by": "team", "from": "2026-03-01T00:00:00Z",
                                                              "to": "2026-03-05T00:00:00Z"}, timeout=60).json()
        hours = sum(Decimal(row["gpu_hours"]) for row in report["rows"])
        assert hours == sum(_expected_gpu_seconds(i) for i in range(jobs)) / 3600
    finally:
        cluster.stop()
        proxy.close()
