"""Telemetry scaled out: 1, 2 and 4 replicas sharing the 8 partitions, in one run.

For each replica count: start the replicas (WHALEFLUX_SCALE_OUT=true), wait until they hold the partitions
between them, publish N nodes x 8 GPUs flat out for a while (a backlog builds in JetStream), then measure how
fast the replicas together store it: total GPU samples/s and CPU microseconds per stored sample (the replicas
and redis-server, from /proc). The same run's reference is one process without scale-out (one durable, as
bench/telemetry_ingest.py measures it). On a 2-core machine the total is bounded by the cores, not by the
replicas: the CPU per sample is the figure that carries over to more cores.

    python bench/telemetry_replicas.py [--nodes 100] [--seconds 8] [--drain 10] [--replicas 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import httpx  # noqa: E402
import nats  # noqa: E402
from telemetry_harness import CpuMeter, TelemetryProc, iso, node_templates, server_env, start_servers  # noqa: E402

from whaleflux.servers import free_port  # noqa: E402
from whaleflux.shared.bus import Bus  # noqa: E402

GPUS = 8
ADMIN = "bench-admin-token-0123456789"


def start_replicas(servers, count: int, scale_out: bool, tag: str) -> list[TelemetryProc]:
    procs = []
    for i in range(count):
        port = free_port()
        env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port), "WHALEFLUX_ADMIN_TOKEN": ADMIN,
               "WHALEFLUX_INSTANCE": f"{tag}-{i}"}
        if scale_out:
            env["WHALEFLUX_SCALE_OUT"] = "true"
        popen = subprocess.Popen([sys.executable, "-m", "whaleflux", "service", "telemetry"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(TelemetryProc(popen, f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 120
    for proc in procs:
        while True:
            try:
                if httpx.get(proc.url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("telemetry replicas not ready in 120 s")
            time.sleep(0.2)
    return procs


def units(proc: TelemetryProc) -> list[str]:
    status = httpx.get(proc.url + "/admin/status", timeout=10, headers={"Authorization": f"Bearer {ADMIN}"}).json()
    return list(status.get("units", []))


def wait_shared(procs: list[TelemetryProc], timeout: float = 90.0) -> list[list[str]]:
    """Until the replicas hold all 9 units between them, each at least one partition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = [units(p) for p in procs]
        parts = [[u for u in h if u != "main"] for h in held]
        if sum(len(h) for h in held) == 9 and all(parts):
            return held
        time.sleep(0.5)
    raise SystemExit(f"partitions not shared in {timeout} s: {held}")


def publish(servers, nodes: int, seconds: float, seq0: int) -> int:
    templates = node_templates(nodes, GPUS)

    async def main() -> int:
        nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password,
                                pending_size=64 * 1024 * 1024)
        sent, seq = 0, seq0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seq += 1
            stamp = iso(time.time())
            for t in templates:
                await nc.publish(t.subject, t.batch(seq, stamp))
                sent += len(t.registration.gpus)
            await nc.flush(timeout=30)
        await nc.close()
        return sent

    return asyncio.run(main())


def register(servers, nodes: int) -> None:
    async def main() -> None:
        bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user,
                                password=servers.nats_password)
        for t in node_templates(nodes, GPUS):
            await bus.publish(f"node.registered.bench.{t.node}", t.registration)
        await bus.close()

    asyncio.run(main())


def settle(procs: list[TelemetryProc], quiet_s: float = 3.0, limit_s: float = 120.0) -> None:
    """Until the stored count stops moving (the backlog is worked off), so the next configuration starts clean."""
    last, still, deadline = -1.0, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = sum(p.stored() for p in procs)
        if now != last:
            last, still = now, time.monotonic()
        elif time.monotonic() - still >= quiet_s:
            return
        time.sleep(0.5)


def measure(servers, count: int, scale_out: bool, nodes: int, seconds: float, drain: float, seq0: int) -> dict:
    tag = f"r{count}{'s' if scale_out else 'u'}"
    procs = start_replicas(servers, count, scale_out, tag)
    try:
        held = wait_shared(procs) if scale_out else [["(one durable)"]]
        register(servers, nodes)
        time.sleep(2)
        sent = publish(servers, nodes, seconds, seq0)
        before = sum(p.stored() for p in procs)
        meter = CpuMeter({**{f"t{i}": p.popen.pid for i, p in enumerate(procs)}, "redis": servers.procs[1].pid})
        meter.start()
        time.sleep(drain)
        after = sum(p.stored() for p in procs)
        cpu = meter.stop()
        stored = after - before
        replicas_cpu = sum(v for k, v in cpu.items() if k.startswith("t"))
        settle(procs)
        return {"replicas": count, "scale_out": scale_out, "units": held, "published": sent,
                "stored_per_s": stored / cpu["_wall"], "us_per_sample": replicas_cpu / max(stored, 1) * 1e6,
                "redis_us_per_sample": cpu["redis"] / max(stored, 1) * 1e6, "load": os.getloadavg()[0]}
    finally:
        for p in procs:  # SIGTERM: each hands its units over; all at once, on a loaded machine that takes a while
            p.popen.terminate()
        for p in procs:
            try:
                p.popen.wait(90)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--drain", type=float, default=10)
    ap.add_argument("--replicas", default="1,2,4")
    args = ap.parse_args()
    servers = start_servers()
    rows = []
    try:
        rows.append(measure(servers, 1, False, args.nodes, args.seconds, args.drain, 0))
        for i, count in enumerate(int(c) for c in args.replicas.split(",")):
            rows.append(measure(servers, count, True, args.nodes, args.seconds, args.drain, (i + 1) * 1_000_000))
    finally:
        servers.stop()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.nodes} nodes x {GPUS} GPUs "
          f"published flat out for {args.seconds} s, then {args.drain} s of the backlog measured")
    print("| replicas | stored GPU samples/s (all replicas) | CPU per sample, replicas | redis-server | load |")
    print("|---|---|---|---|---|")
    for r in rows:
        label = f"{r['replicas']}" + (" (scale-out, 8 partitions)" if r["scale_out"] else " (reference: one durable)")
        print(f"| {label} | {r['stored_per_s']:,.0f} | {r['us_per_sample']:.1f} us | "
              f"{r['redis_us_per_sample']:.1f} us | {r['load']:.1f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
