"""Telemetry scaled out: 1, 2 and 4 replicas sharing the 8 partitions, in one run.

For each replica count: start the replicas (WHALEFLUX_SCALE_OUT=true), wait until they hold the partitions
between them, warm them up (a few rounds of every node, stored), then pause them (SIGSTOP), publish a fixed
backlog of N nodes x 8 GPUs x R rounds into JetStream, resume them (SIGCONT) and time how long they take to
store all of it (their consumers in nats-server with nothing pending or unacked). Reported: total GPU samples/s
over that drain, and CPU microseconds per stored sample from the replicas' own CPU time (/proc) over the same
interval, also less what they use idle (measured just before: lease ticks, idle fetches), and redis-server's,
with the load average before and after. The same run's reference is one process without scale-out (one durable, as
bench/telemetry_ingest.py measures it). On a 2-core machine the total is bounded by the cores, not by the
replicas: the CPU per sample, flat as replicas are added, is the figure that carries over to more cores.

    python bench/telemetry_replicas.py [--nodes 100] [--rounds 100] [--warmup 10] [--replicas 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
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
# Leases long enough that replicas paused while the backlog is published keep their partitions (a tick is a
# third of it, and sharing the partitions takes a few ticks).
LEASE_S = "15"




def start_replicas(servers, count: int, scale_out: bool, tag: str) -> list[TelemetryProc]:
    procs = []
    for i in range(count):
        port = free_port()
        env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port), "WHALEFLUX_ADMIN_TOKEN": ADMIN,
               "WHALEFLUX_INSTANCE": f"{tag}-{i}"}
        if scale_out:
            env.update({"WHALEFLUX_SCALE_OUT": "true", "WHALEFLUX_PARTITION_LEASE_S": LEASE_S})
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



def publish(servers, nodes: int, rounds: int, seq0: int) -> int:
    """`rounds` batches of every node, as fast as NATS takes them; the GPU samples sent."""
    templates = node_templates(nodes, GPUS)

    async def main() -> int:
        nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password,
                                pending_size=64 * 1024 * 1024)
        sent = 0
        for r in range(rounds):
            stamp = iso(time.time())
            for t in templates:
                await nc.publish(t.subject, t.batch(seq0 + r + 1, stamp))
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



def settle(procs: list[TelemetryProc], quiet_s: float = 3.0, limit_s: float = 120.0) -> float:
    """Until the stored count stops moving (what was published is worked off); that count."""
    last, still, deadline = -1.0, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = sum(p.stored() for p in procs)
        if now != last:
            last, still = now, time.monotonic()
        elif time.monotonic() - still >= quiet_s:
            return now
        time.sleep(0.5)
    return last


def drain(servers, durables: list[str], limit_s: float = 300.0) -> float:
    """Poll nats-server until the consumers have nothing pending or unacked (every batch stored and acked); when.
    (Asking the replicas would cost them CPU while they are measured.)"""
    async def main() -> float:
        nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
        try:
            js = nc.jetstream()
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                infos = [await js.consumer_info("WHALEFLUX_TELEMETRY", d) for d in durables]
                if sum(i.num_pending + i.num_ack_pending for i in infos) == 0:
                    return time.monotonic()
                await asyncio.sleep(0.1)
            raise SystemExit(f"backlog not drained in {limit_s} s")
        finally:
            await nc.close()

    return asyncio.run(main())


FLAGGED = r'^whaleflux_telemetry_batches_flagged_total\{reason="([^"]+)"\} (\S+)$'


def flagged(procs: list[TelemetryProc]) -> dict[str, float]:
    """Telemetry batches flagged, by reason, all replicas together (duplicate_seq and out_of_order refused)."""
    out: dict[str, float] = {}
    for p in procs:
        text = httpx.get(p.url + "/metrics", timeout=30).text
        for reason, n in re.findall(FLAGGED, text, re.M):
            out[reason] = out.get(reason, 0.0) + float(n)
    return out


def dead_letters(servers) -> int:
    async def main() -> int:
        nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
        try:
            return (await nc.jetstream().stream_info("WHALEFLUX_DEADLETTER")).state.messages
        finally:
            await nc.close()

    return asyncio.run(main())


def idle_cpu(procs: list[TelemetryProc], seconds: float = 3.0) -> float:
    """CPU seconds per second the replicas use with nothing to store (lease ticks, idle fetches)."""
    meter = CpuMeter({f"t{i}": p.popen.pid for i, p in enumerate(procs)}).start()
    time.sleep(seconds)
    used = meter.stop()
    return sum(v for k, v in used.items() if k != "_wall") / used["_wall"]


def signal_all(procs: list[TelemetryProc], sig: signal.Signals) -> None:
    for p in procs:
        os.kill(p.popen.pid, sig)


def measure(servers, count: int, scale_out: bool, nodes: int, rounds: int, warmup: int, seq0: int) -> dict:
    tag = f"r{count}{'s' if scale_out else 'u'}"
    procs = start_replicas(servers, count, scale_out, tag)
    try:
        held = wait_shared(procs) if scale_out else [["(one durable)"]]
        register(servers, nodes)
        time.sleep(2)  # the registrations reach the replicas (the one holding `main` runs the node consumer)
        publish(servers, nodes, warmup, seq0)  # caches filled, every consumer bound and fetching
        base = settle(procs)
        flagged0, dead0 = flagged(procs), dead_letters(servers)
        idle = idle_cpu(procs)
        durables = [f"telemetry-gpu-p{k}" for k in range(8)] if scale_out else ["telemetry-gpu"]
        load_before = os.getloadavg()[0]
        signal_all(procs, signal.SIGSTOP)
        try:
            sent = publish(servers, nodes, rounds, seq0 + warmup)
            pids = {f"t{i}": p.popen.pid for i, p in enumerate(procs)}
            meter = CpuMeter({**pids, "redis": servers.procs[1].pid}).start()
        finally:
            signal_all(procs, signal.SIGCONT)
        drained = drain(servers, durables)
        cpu = meter.stop()
        wall = drained - meter.t0  # resumed -> every batch stored and acked
        done = settle(procs) - base
        flags = {k: v - flagged0.get(k, 0.0) for k, v in flagged(procs).items() if v - flagged0.get(k, 0.0)}
        dead = dead_letters(servers) - dead0
        replicas_cpu = sum(v for k, v in cpu.items() if k.startswith("t"))
        return {"replicas": count, "scale_out": scale_out, "units": held, "published": sent, "stored": done,
                "drain_s": wall, "stored_per_s": done / wall, "us_per_sample": replicas_cpu / max(done, 1) * 1e6,
                "net_us_per_sample": (replicas_cpu - idle * cpu["_wall"]) / max(done, 1) * 1e6, "idle_cpu": idle,
                "redis_us_per_sample": cpu["redis"] / max(done, 1) * 1e6, "load": (load_before, os.getloadavg()[0]),
                "flagged": flags, "dead_lettered": dead}
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
    ap.add_argument("--rounds", type=int, default=100, help="batches of every node in the timed backlog")
    ap.add_argument("--warmup", type=int, default=10, help="batches of every node stored before it")
    ap.add_argument("--replicas", default="1,2,4")
    args = ap.parse_args()
    loads = [os.getloadavg()]
    servers = start_servers()
    rows = []
    step = args.warmup + args.rounds
    try:
        rows.append(measure(servers, 1, False, args.nodes, args.rounds, args.warmup, 0))
        for i, count in enumerate(int(c) for c in args.replicas.split(",")):
            rows.append(measure(servers, count, True, args.nodes, args.rounds, args.warmup, (i + 1) * step))
    finally:
        servers.stop()
    loads.append(os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.nodes} nodes x {GPUS} GPUs; "
          f"{args.warmup} rounds of warm-up, then a backlog of {args.rounds} rounds published to the paused "
          "replicas, timed from their resumption to its last sample stored")
    print("load average (1/5/15 min) at the start: {:.1f} / {:.1f} / {:.1f}; at the end: {:.1f} / {:.1f} / {:.1f}"
          .format(*loads[0], *loads[1]))
    print("| replicas | stored GPU samples/s (all replicas) | CPU per sample, replicas | less their idle CPU "
          "| idle CPU, replicas | redis-server | stored | drain | load (before / after) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        label = f"{r['replicas']}" + (" (scale-out, 8 partitions)" if r["scale_out"] else " (reference: one durable)")
        print(f"| {label} | {r['stored_per_s']:,.0f} | {r['us_per_sample']:.1f} us | {r['net_us_per_sample']:.1f} us "
              f"| {r['idle_cpu'] * 100:.1f} % | {r['redis_us_per_sample']:.1f} us "
              f"| {r['stored']:,.0f} of {r['published']:,} ({r['dead_lettered']} batches dead-lettered"
              f"{''.join(f', {n:.0f} {k}' for k, n in r['flagged'].items())}) | {r['drain_s']:.1f} s "
              f"| {r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
