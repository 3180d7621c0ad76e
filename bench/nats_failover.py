"""One NATS server of three killed (-9) under telemetry and a stream of jobs: events lost, jobs run twice,
time until publishing resumes.

Three nats-servers from the wheel as one JetStream cluster (R3 streams), Redis, the telemetry and scheduler
services and one simulated agent (2 nodes, 12 GPUs) that runs the jobs as real processes. This process
publishes `--gpus` GPUs of telemetry at 1 Hz from nodes it registers and drains (no agent runs them, so no job
is placed there; 8-GPU node batches through JetStream, each acknowledged,
retried with its id until it is) and submits `--jobs-per-s` jobs. At `--kill-at` s it kills the server
leading the JOBS stream, at `--restart-at` s it starts it again. Then it counts:
- events lost: telemetry batches and submissions JetStream acknowledged but the stream does not hold;
- jobs run twice: jobs with more than one job.started; jobs not finished;
- the longest wait for a publish to be acknowledged (the time publishing stalled around the kill), and the
  reference: the longest before the kill;
- whether the restarted server is current again (its copy of each stream).

    python bench/nats_failover.py [--gpus 10000] [--seconds 60] [--kill-at 20] [--restart-at 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import httpx  # noqa: E402
import nats.errors  # noqa: E402
from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: E402
from telemetry_harness import iso, node_templates  # noqa: E402

from whaleflux.servers import LocalServers  # noqa: E402
from whaleflux.shared import subjects  # noqa: E402
from whaleflux.shared.bus import Bus  # noqa: E402
from whaleflux.shared.events import JobSubmitted, NodeDrainRequested  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.conftest import Servers  # noqa: E402
from tests.processes import make_cluster, wait_until  # noqa: E402

GPUS_PER_NODE = 8
TROUBLE = (nats.errors.Error, TimeoutError, OSError)


async def publish_acked(bus: Bus, subject: str, payload: bytes, msg_id: str, waits: list[tuple[float, float]]) -> None:
    """Publish until JetStream acknowledges it (same id: stored once); record (sent at, seconds to ack)."""
    began = time.monotonic()
    while True:
        try:
            await bus.js.publish(subject, payload, headers={"Nats-Msg-Id": msg_id}, timeout=5)
            waits.append((began, time.monotonic() - began))
            return
        except TROUBLE:
            await asyncio.sleep(0.1)


async def load(servers: Servers, local: LocalServers, args, victim: int) -> dict:
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user,
                            password=servers.nats_password, replicas=3)
    templates = node_templates(max(1, args.gpus // GPUS_PER_NODE), GPUS_PER_NODE)
    waits: list[tuple[float, float]] = []
    job_waits: list[tuple[float, float]] = []
    sent_batches, jobs = 0, list[str]()
    start = time.monotonic()
    killed_at = restarted_at = None
    inflight: set[asyncio.Task[None]] = set()
    second = 0
    assert local.cluster is not None
    while (elapsed := time.monotonic() - start) < args.seconds:
        if killed_at is None and elapsed >= args.kill_at:
            local.cluster.kill9(victim)
            killed_at = time.monotonic()
        if restarted_at is None and elapsed >= args.restart_at:
            await asyncio.to_thread(local.cluster.restart, victim)
            restarted_at = time.monotonic()
        second += 1
        stamp = iso(time.time())
        for t in templates:  # one batch per node per second, up to 2,000 in flight
            while len(inflight) >= 2000:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                inflight = {task for task in inflight if not task.done()}
            task = asyncio.create_task(publish_acked(bus, t.subject, t.batch(second, stamp), f"{t.node}-{second}",
                                                     waits))
            inflight.add(task)
            sent_batches += 1
        for _ in range(args.jobs_per_s):
            job_id = f"fo-{len(jobs):05d}"
            jobs.append(job_id)
            env = bus.envelope(JobSubmitted(job_id=job_id, name=job_id, team="bench", command=["true"], gpus=1,
                                            submitted_by="bench"), subject=job_id, event_id=f"submit-{job_id}")
            inflight.add(asyncio.create_task(publish_acked(bus, subjects.JOB_SUBMITTED, env.model_dump_json().encode(),
                                                           env.id, job_waits)))
        next_at = start + second
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await asyncio.gather(*inflight)
    await bus.close()
    return {"sent_batches": sent_batches, "acked_batches": len(waits), "jobs": jobs, "waits": waits,
            "job_waits": job_waits, "killed_at": killed_at, "restarted_at": restarted_at, "start": start}


async def register_sources(servers: Servers, nodes: int) -> None:
    """Register the nodes whose telemetry this process publishes, and drain them: they have no agent, so the
    scheduler must place no job there (without the drain, jobs queued during the failover spilled onto them and
    were counted as placed but never started)."""
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    try:
        for t in node_templates(nodes, GPUS_PER_NODE):
            await bus.publish(f"node.registered.bench.{t.node}", t.registration)
            await bus.publish(subjects.node_drain_requested("bench", t.node),
                              NodeDrainRequested(cluster="bench", node=t.node, reason="bench telemetry source"))
    finally:
        await bus.close()


async def stored(servers: Servers, stream: str, subject: str) -> int:
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    bus.js = bus.nc.jetstream(timeout=30)
    info = await bus.js.add_consumer(stream, ConsumerConfig(filter_subject=subject, deliver_policy=DeliverPolicy.ALL,
                                                            inactive_threshold=30))
    await bus.close()
    return int(info.num_pending or 0)


async def started_per_job(servers: Servers) -> Counter[str]:
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    bus.js = bus.nc.jetstream(timeout=30)
    sub = await bus.js.pull_subscribe(f"{subjects.JOB_STARTED}.>", stream="WHALEFLUX_JOBS")
    got: Counter[str] = Counter()
    while True:
        try:
            msgs = await sub.fetch(500, timeout=2)
        except TimeoutError:
            break
        for m in msgs:
            got[json.loads(m.data)["data"]["job_id"]] += 1
    await bus.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--kill-at", type=float, default=20)
    ap.add_argument("--restart-at", type=float, default=40)
    ap.add_argument("--jobs-per-s", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wf-failover-"))
    local = LocalServers(tmp / "servers", "whaleflux", secrets.token_urlsafe(16), secrets.token_urlsafe(16),
                         nats_cluster=3).start()
    servers = Servers(local.nats_url, local.redis_url, local.nats_user, local.nats_password, local.redis_password)
    system = make_cluster(servers, tmp)
    system.base_env.update(WHALEFLUX_NATS_REPLICAS="3")
    try:
        for name in ("telemetry", "scheduler"):
            system.service(name)
        system.agent("r4090-01", "h100-01")
        for name in ("telemetry", "scheduler"):
            system.procs[name].wait_ready()

        async def leader() -> str:
            bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user,
                                    password=servers.nats_password)
            info = await bus.js.stream_info("WHALEFLUX_JOBS")
            await bus.close()
            assert info.cluster is not None
            return str(info.cluster.leader)

        assert local.cluster is not None
        sources = max(1, args.gpus // GPUS_PER_NODE)
        asyncio.run(register_sources(servers, sources))
        scheduler = system.procs["scheduler"]

        def drained() -> bool:
            nodes = httpx.get(f"{scheduler.url}/v1/nodes", timeout=10).json()
            return sum(1 for n in nodes if n["cluster"] == "bench" and n["status"] == "draining") == sources

        wait_until(drained, timeout=900, what="the telemetry sources drained")  # one drain at a time
        name = asyncio.run(leader())
        victim = next(i for i in range(3) if local.cluster.server_name(i) == name)
        result = asyncio.run(load(servers, local, args, victim))
        local.cluster.wait_current(victim, timeout=120)

        def states() -> Counter[str]:
            return Counter(httpx.get(f"{scheduler.url}/v1/jobs/{j}", timeout=10).json().get("state")
                           for j in result["jobs"])

        try:
            wait_until(lambda: states().get("succeeded") == len(result["jobs"]), timeout=180, what="jobs done")
        except TimeoutError:
            pass
        final = states()
        system.procs["agent"].stop()
        in_stream = asyncio.run(stored(servers, "WHALEFLUX_TELEMETRY", "gpu.telemetry.bench.>"))
        submitted = asyncio.run(stored(servers, "WHALEFLUX_JOBS", subjects.JOB_SUBMITTED))
        runs = asyncio.run(started_per_job(servers))
    finally:
        system.stop()
        local.stop()
    killed, start = result["killed_at"], result["start"]
    before = [w for t, w in result["waits"] if t < killed - 1]
    around = [w for t, w in result["waits"] + result["job_waits"] if t >= killed - 1]
    elapsed = args.seconds
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}")
    print(f"telemetry: {args.gpus:,} GPUs at 1 Hz asked; {result['acked_batches'] * GPUS_PER_NODE / elapsed:,.0f} "
          f"GPU samples/s acknowledged over {elapsed:.0f} s; killed the JOBS leader at {killed - start:.1f} s, "
          f"restarted at {result['restarted_at'] - start:.1f} s")
    print(f"telemetry batches acknowledged {result['acked_batches']:,}, in the stream {in_stream:,}: "
          f"lost {result['acked_batches'] - in_stream:,} (sent {result['sent_batches']:,})")
    print(f"jobs submitted {len(result['jobs'])}, in the stream {submitted}: lost {len(result['jobs']) - submitted}; "
          f"states {dict(final)}; run twice {sum(1 for n in runs.values() if n > 1)}; never started "
          f"{sum(1 for j in result['jobs'] if j not in runs)}")
    print(f"longest wait for an acknowledgement: before the kill {max(before, default=0):.2f} s (reference), "
          f"from the kill on {max(around, default=0):.2f} s (publishing stalled at most that long)")
    print("restarted server current again: yes (healthz)")
    print(f"logs: {tmp / 'logs'}")


if __name__ == "__main__":
    main()
