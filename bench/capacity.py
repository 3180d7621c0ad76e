"""Capacity: what one process of each service handles on one core, and the replicas a fleet needs.

    python bench/capacity.py [--nodes 250] [--rounds 20] [--jobs 2000] [--burst 200]

Every figure is CPU time, not wall time: each service runs as a real process on servers of its own, and the
CPU seconds it used (Linux /proc) to work off a known backlog are divided by what it handled, so a busy
machine slows the run but not the figure (much: caches and the scheduler's time slices still suffer).

- GPU samples: `--nodes` simulated 8-GPU nodes registered, then `--rounds` rounds of one telemetry batch per
  node published; each of telemetry, scheduler, alerting, billing and inventory (every service that consumes
  gpu.telemetry) is measured on its own until its consumer has acked them all. nats-server's and
  redis-server's CPU per sample are measured in the telemetry run.
- Job events: billing working off a backlog of `--jobs` jobs' placed / started / finished events; the
  scheduler's CPU per job end to end (submitted, placed, started, finished, on the demo fleet's 28 GPUs) from
  `bench/scheduler_burst.py --jobs BURST --seconds 0.5`.

Prints the per-core table and, for 1,000, 10,000 and 100,000 GPUs at 1 Hz, the cores (one process each)
every service needs. The reference in the same run: a bare pull consumer fetching and acking the same
telemetry backlog (what the bus alone costs per sample, in the bench process).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats

sys.path.insert(0, os.path.dirname(__file__))

from billing_service_ingest import publish_job_events  # noqa: E402
from telemetry_harness import CpuMeter, cpu_seconds, iso, node_templates, server_env, start_servers  # noqa: E402

from whaleflux.servers import LocalServers, free_port  # noqa: E402
from whaleflux.shared.bus import Bus  # noqa: E402
from whaleflux.shared.streams import CONSUMERS  # noqa: E402

GPUS = 8
SAMPLE_SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
FLEETS = (1_000, 10_000, 100_000)
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Service:
    name: str
    popen: subprocess.Popen
    url: str

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def start_service(servers: LocalServers, name: str) -> Service:
    port = free_port()
    env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port),
           # Nothing answers there: the services that fetch from inventory or billing fail fast and go on.
           "WHALEFLUX_INVENTORY_URL": "http://127.0.0.1:9", "WHALEFLUX_BILLING_URL": "http://127.0.0.1:9"}
    popen = subprocess.Popen([sys.executable, "-m", "whaleflux", "service", name], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise SystemExit(f"{name} exited {popen.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return Service(name, popen, url)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    popen.kill()
    raise SystemExit(f"{name} not ready in 180 s")


async def _drained(js, stream: str, durable: str, last_seq: int) -> bool:
    info = await js.consumer_info(stream, durable)
    return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq >= last_seq


async def publish_telemetry(servers: LocalServers, nodes: int, rounds: int, register: bool) -> int:
    """Registrations (once), then `rounds` batches per node; the telemetry stream's last sequence."""
    templates = node_templates(nodes, GPUS)
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    try:
        if register:
            for t in templates:
                await bus.publish(f"node.registered.bench.{t.node}", t.registration)
        nc = bus.nc
        seq = int(time.time())
        for _ in range(rounds):
            seq += 1
            stamp = iso(time.time())
            for t in templates:
                await nc.publish(t.subject, t.batch(seq, stamp))
            await nc.flush()
        info = await bus.js.stream_info("WHALEFLUX_TELEMETRY")
        return int(info.state.last_seq)
    finally:
        await bus.close()


async def wait_drained(servers: LocalServers, stream: str, durable: str, last_seq: int, timeout: float) -> None:
    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while not await _drained(js, stream, durable, last_seq):
            if time.monotonic() > deadline:
                raise SystemExit(f"{durable} did not work off its backlog in {timeout:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        await nc.close()


def sample_cost(servers: LocalServers, name: str, nodes: int, rounds: int) -> dict[str, float]:
    """CPU microseconds per GPU sample of one service process (and, for telemetry, of nats-server and redis)."""
    svc = start_service(servers, name)
    try:
        asyncio.run(publish_telemetry(servers, nodes, 1, register=True))  # registered, and one warm-up round
        pids = {name: svc.popen.pid}
        if name == "telemetry":
            pids |= {"nats-server": servers.procs[0].pid, "redis-server": servers.procs[1].pid}
        meter = CpuMeter(pids).start()
        last = asyncio.run(publish_telemetry(servers, nodes, rounds, register=False))
        durable = next(c for c, spec in CONSUMERS.items()
                       if c.startswith(f"{name}-") and spec.stream == "WHALEFLUX_TELEMETRY")
        asyncio.run(wait_drained(servers, "WHALEFLUX_TELEMETRY", durable, last, timeout=900))
        used = meter.stop()
    finally:
        svc.stop()
    samples = nodes * GPUS * rounds
    return {who: used[who] / samples * 1e6 for who in pids}


async def bare_reference(servers: LocalServers, nodes: int, rounds: int) -> float:
    """CPU microseconds per GPU sample for a bare pull consumer to fetch and ack a telemetry backlog."""
    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    try:
        js = nc.jetstream()
        # Created before the backlog is published: it gets every message of it.
        sub = await js.pull_subscribe("gpu.telemetry.>", durable="bench-capacity-reference",
                                      stream="WHALEFLUX_TELEMETRY")
        first = int((await js.stream_info("WHALEFLUX_TELEMETRY")).state.last_seq)
        last = await publish_telemetry(servers, nodes, rounds, register=False)
        c0, got = cpu_seconds(os.getpid()), 0
        while got < last - first:
            try:
                msgs = await sub.fetch(256, timeout=1)
            except TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
        return (cpu_seconds(os.getpid()) - c0) / (nodes * GPUS * rounds) * 1e6
    finally:
        await nc.close()


async def publish_jobs(servers: LocalServers, jobs: int) -> int:
    """bench/billing_service_ingest.py's placed / started / finished for `jobs` jobs; the jobs stream's last seq."""
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    try:
        await publish_job_events(bus, jobs, prefix="cap")
        info = await bus.js.stream_info("WHALEFLUX_JOBS")
        return int(info.state.last_seq)
    finally:
        await bus.close()


def billing_job_cost(servers: LocalServers, jobs: int) -> float:
    """CPU microseconds per job event of one billing process."""
    svc = start_service(servers, "billing")
    try:
        c0 = cpu_seconds(svc.popen.pid)
        last = asyncio.run(publish_jobs(servers, jobs))
        asyncio.run(wait_drained(servers, "WHALEFLUX_JOBS", "billing-jobs", last, timeout=900))
        return (cpu_seconds(svc.popen.pid) - c0) / (jobs * 3) * 1e6
    finally:
        svc.stop()


def scheduler_job_cost(burst: int) -> float | None:
    """Scheduler CPU milliseconds per job end to end, from bench/scheduler_burst.py (None if it failed)."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scheduler_burst.py"), "--jobs", str(burst),
                          "--seconds", "0.5"], capture_output=True, text=True, timeout=1800)
    found = re.search(r"\((\d+) ms per job\)", out.stdout)
    if found is None:
        print(f"scheduler_burst.py failed (exit {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        return None
    return float(found.group(1))


def per_core(us: float) -> float:
    return 1e6 / us if us > 0 else math.inf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=200)
    args = ap.parse_args()
    load0 = os.getloadavg()
    costs: dict[str, float] = {}
    servers = start_servers()
    try:
        for name in SAMPLE_SERVICES:
            costs |= sample_cost(servers, name, args.nodes, args.rounds)
            print(f"  measured {name}: {costs[name]:.1f} us CPU per GPU sample", flush=True)
        reference = asyncio.run(bare_reference(servers, args.nodes, args.rounds))
        billing_us = billing_job_cost(servers, args.jobs)
    finally:
        servers.stop()
    scheduler_ms = scheduler_job_cost(args.burst)
    load1 = os.getloadavg()

    samples = args.nodes * GPUS * args.rounds
    print(f"\n# Capacity of one process on one core ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
          f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end)\n")
    print(f"GPU samples: {args.nodes} nodes x {GPUS} GPUs x {args.rounds} rounds = {samples:,} per service")
    print("| process | CPU per GPU sample | GPU samples/s on one core |")
    print("|---|---|---|")
    for name in (*SAMPLE_SERVICES, "nats-server", "redis-server"):
        print(f"| {name} | {costs[name]:.1f} us | {per_core(costs[name]):,.0f} |")
    print(f"| reference: bare pull consumer, fetch + ack only | {reference:.1f} us | {per_core(reference):,.0f} |")
    print(f"\nJob events: billing {billing_us:.0f} us CPU per event = {per_core(billing_us):,.0f} events/s on one "
          f"core ({args.jobs} jobs x placed/started/finished)")
    if scheduler_ms is not None:
        print(f"Job events: scheduler {scheduler_ms:.0f} ms CPU per job end to end (submitted, placed, started, "
              f"finished) = {1000 / scheduler_ms:,.0f} jobs/s, {4000 / scheduler_ms:,.0f} job events/s on one core "
              f"(bench/scheduler_burst.py --jobs {args.burst} --seconds 0.5)")
    print("\n# Cores (one process each) for GPUs at 1 Hz: GPU samples/s / samples/s on one core, rounded up\n")
    print("| process | " + " | ".join(f"{g:,} GPUs" for g in FLEETS) + " |")
    print("|---|" + "---|" * len(FLEETS))
    for name in (*SAMPLE_SERVICES, "nats-server", "redis-server"):
        print(f"| {name} | " + " | ".join(f"{math.ceil(g / per_core(costs[name]))}" for g in FLEETS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
