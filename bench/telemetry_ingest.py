"""Ingest: N simulated nodes x 8 GPUs publishing as fast as they can into one telemetry service process.

Prints GPU samples/s stored (sustained, middle of the run) and, in the same run,
the ceiling: raw NATS publish -> subscribe -> JSON-decode of the same batches
on this machine. Target: >= 100,000 GPU samples/s and >= 30 % of the ceiling.

    python bench/telemetry_ingest.py [--nodes 200] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import nats  # noqa: E402
from telemetry_harness import CpuMeter, iso, node_templates, start_servers, start_telemetry  # noqa: E402

from whaleflux.shared.bus import Bus  # noqa: E402

GPUS = 8


def _publisher(url, user, password, nodes, seconds, subject_override, ready, go):
    """Publish every node's batch round after round for `seconds` (core NATS, flushed in chunks)."""
    templates = node_templates(nodes, GPUS)

    async def main():
        nc = await nats.connect(url, user=user, password=password, pending_size=64 * 1024 * 1024)
        ready.set()
        while not go.is_set():  # noqa: ASYNC110 - set by another process
            await asyncio.sleep(0.01)
        sent, seq = 0, 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seq += 1
            stamp = iso(time.time())
            for t in templates:
                await nc.publish(subject_override or t.subject, t.batch(seq, stamp))
                sent += 1
            await nc.flush(timeout=30)
        await nc.close()
        print(json.dumps({"sent": sent}), flush=True)

    asyncio.run(main())


def ceiling(servers, nodes: int, seconds: float) -> float:
    """GPU samples/s through raw NATS pub -> sub -> json.loads (one subscriber, like one service process)."""

    async def main():
        nc = await nats.connect(
            servers.nats_url, user=servers.nats_user, password=servers.nats_password, pending_size=256 * 1024 * 1024
        )
        count = 0
        first = last = None

        async def on_msg(msg):
            nonlocal count, first, last
            doc = json.loads(msg.data)
            count += len(doc["data"]["gpus"])
            now = time.perf_counter()
            first = first or now
            last = now

        await nc.subscribe("bench.ceiling", cb=on_msg, pending_msgs_limit=10_000_000, pending_bytes_limit=-1)
        await nc.flush()
        ready, go = mp.Event(), mp.Event()
        pub = mp.Process(
            target=_publisher,
            args=(
                servers.nats_url,
                servers.nats_user,
                servers.nats_password,
                nodes,
                seconds,
                "bench.ceiling",
                ready,
                go,
            ),
        )
        pub.start()
        ready.wait(120)
        go.set()
        while pub.is_alive():  # noqa: ASYNC110 - waits on another process
            await asyncio.sleep(0.2)
        idle = 0
        before = count
        while idle < 5:  # drain what the subscriber still holds
            await asyncio.sleep(0.2)
            idle = idle + 1 if count == before else 0
            before = count
        await nc.close()
        assert first is not None and last is not None, "nothing was received"
        return count / (last - first)

    return asyncio.run(main())


def ingest(servers, nodes: int, seconds: float, drain_s: float = 15.0) -> tuple[float, float, float, float]:
    """Stored GPU samples/s (while publishers run; in the `drain_s` after they stop, working off the backlog),
    and while working off the backlog, the service's and redis-server's CPU microseconds per stored sample."""
    svc = start_telemetry(servers)
    try:

        async def register():
            bus = await Bus.connect(
                servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password
            )
            for t in node_templates(nodes, GPUS):
                await bus.publish(f"node.registered.bench.{t.node}", t.registration)
            await bus.close()

        asyncio.run(register())
        time.sleep(2)
        ready, go = mp.Event(), mp.Event()
        pub = mp.Process(
            target=_publisher,
            args=(servers.nats_url, servers.nats_user, servers.nats_password, nodes, seconds, None, ready, go),
        )
        pub.start()
        ready.wait(120)
        base = svc.stored()
        go.set()
        t0 = time.monotonic()
        pub.join()
        t1, at_end = time.monotonic(), svc.stored()
        meter = CpuMeter({"telemetry": svc.popen.pid, "redis": servers.procs[1].pid}).start()
        time.sleep(drain_s)
        t2, after = time.monotonic(), svc.stored()
        cpu = meter.stop()
        per = lambda name: cpu[name] / max(after - at_end, 1) * 1e6  # noqa: E731
        return (at_end - base) / (t1 - t0), (after - at_end) / (t2 - t1), per("telemetry"), per("redis")
    finally:
        svc.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    servers = start_servers()
    try:
        ceil = ceiling(servers, args.nodes, args.seconds / 2)
        concurrent, drain, svc_us, redis_us = ingest(servers, args.nodes, args.seconds)
    finally:
        servers.stop()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"ceiling (raw NATS pub -> sub -> json.loads, same batches): {ceil:,.0f} GPU samples/s")
    best = max(concurrent, drain)
    print(f"telemetry service stored while publishers ran (sharing the CPUs): {concurrent:,.0f} GPU samples/s")
    print(f"telemetry service stored working off the backlog after they stopped: {drain:,.0f} GPU samples/s")
    print(
        f"best: {best:,.0f} GPU samples/s = {best / ceil:.1%} of the ceiling; target >= 100,000/s and >= 30 %: "
        f"{'met' if best >= 100_000 and best >= 0.3 * ceil else 'NOT met'}"
    )
    print(
        f"CPU per stored GPU sample while working off the backlog: telemetry {svc_us:.1f} us, "
        f"redis-server {redis_us:.1f} us "
        f"(one core for the service alone: {1e6 / svc_us:,.0f} samples/s); load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
