"""Fuzz run (issue 18, Figures): malformed input at every edge of the five services, bounded in time.

- every HTTP route of every service, from its /openapi.json: --per-route malformed requests (default 1,000);
- every upload endpoint (PUT /admin/assets, PUT /admin/pricebook): --yaml hostile YAML documents (default 200);
- every subject a service consumes: --per-subject never-valid messages (default 1,000), the good node's events
  among them.

Services run in-process on their own local NATS and Redis (whaleflux.servers), talked to through their ASGI app.
Prints per edge the counts of 4xx, 5xx, dead-lettered and crashes (an exception out of the app, a consumer loop
that ended, a service that stopped answering), and the 5xx found. Stops sending at --seconds (the counts say
how far it got). Target: 0 5xx, 0 crashes, every bad bus message dead-lettered.

    python bench/fuzz.py [--per-route 1000] [--yaml 200] [--per-subject 1000] [--seconds 900] [--seed 18]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzzing import TOKEN, UPLOADS, Tally, hostile_yaml, malformed_events, outcome_of, printable, requests_for  # noqa: E402
from tests.test_fuzz import SERVICES, running  # noqa: E402
from tests.test_fuzz_bus import base_envelope, concrete, good_node, matches  # noqa: E402
from whaleflux.servers import LocalServers  # noqa: E402
from whaleflux.shared import subjects  # noqa: E402
from whaleflux.shared.bus import Bus  # noqa: E402
from whaleflux.shared.streams import CONSUMERS  # noqa: E402


async def fuzz_http(name: str, client, per_route: int, yaml_docs: int, rng: random.Random, tally: Tally,
                    deadline: float) -> None:
    spec = (await client.get("/openapi.json")).json()
    plan = list(requests_for(spec, rng, per_route, None))
    upload = UPLOADS.get(name)
    for route, req in plan:
        if time.monotonic() > deadline:
            return
        await _send(name, client, route, req.method, req.url, req.headers, req.body, tally)
    if upload is not None:
        for _ in range(yaml_docs):
            if time.monotonic() > deadline:
                return
            await _send(name, client, f"{upload[0]} {upload[1]} (yaml)", upload[0], upload[1],
                        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}, hostile_yaml(rng),
                        tally)


async def _send(name, client, route, method, url, headers, body, tally: Tally) -> None:
    key = f"{name} {route}"
    try:
        r = await client.request(method, url, headers=headers, content=body)
    except Exception as exc:  # noqa: BLE001 - an exception out of the app is a crash: counted, the run goes on
        tally.count(key, "crash")
        tally.failures.append(f"{key}: {printable(url)} -> {type(exc).__name__}: {exc}")
        return
    outcome = outcome_of(r.status_code)
    tally.count(key, outcome)
    if outcome == "5xx" and len(tally.failures) < 50:
        tally.failures.append(f"{key}: {printable(url)} body={printable(repr(body))[:200]} -> {r.status_code}")


async def fuzz_bus(bus: Bus, runtimes: dict, per_subject: int, rng: random.Random, deadline: float) -> dict:
    consumers = {c: CONSUMERS[c] for rt in runtimes.values() for c in rt.consumer_specs()}
    consumed = sorted({concrete(f) for spec in consumers.values() for f in spec.filter_subjects})
    sent: Counter[str] = Counter()
    reg_subject, registered, tel_subject, telemetry = good_node()
    for i, subject in enumerate(consumed):
        base = base_envelope(subject)
        for _ in range(per_subject):
            if time.monotonic() > deadline:
                break
            await bus.js.publish(subject, malformed_events(base, rng))
            sent[subject] += 1
        if i == len(consumed) // 2:
            await bus.publish(reg_subject, registered)
            await bus.publish(tel_subject, telemetry)
    expected = Counter({c: sum(n for s, n in sent.items() if any(matches(f, s) for f in spec.filter_subjects))
                        for c, spec in consumers.items()})
    got, stages = await _dead_letters(bus, sum(expected.values()))
    return {"sent": sent, "expected": expected, "got": got, "stages": stages}


async def _dead_letters(bus: Bus, want: int, quiet_s: float = 20.0) -> tuple[Counter, Counter]:
    sub = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", durable="bench-fuzz-dl",
                                      stream="WHALEFLUX_DEADLETTER")
    got: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    last = time.monotonic()
    while sum(got.values()) < want and time.monotonic() - last < quiet_s:
        try:
            msgs = await sub.fetch(1000, timeout=1.0)
        except TimeoutError:
            continue
        last = time.monotonic()
        for m in msgs:
            headers = m.headers or {}
            got[headers["WhaleFlux-Consumer"]] += 1
            stages[headers["WhaleFlux-Stage"]] += 1
            await m.ack()
    return got, stages


async def main(args: argparse.Namespace) -> int:
    servers = LocalServers(Path(tempfile.mkdtemp(prefix="wf-fuzz-")), "whaleflux", secrets.token_urlsafe(16),
                           secrets.token_urlsafe(16)).start()
    os.environ.update(NATS_URL=servers.nats_url, REDIS_URL=servers.redis_url, WHALEFLUX_NATS_USER=servers.nats_user,
                      WHALEFLUX_NATS_PASSWORD=servers.nats_password, WHALEFLUX_REDIS_PASSWORD=servers.redis_password,
                      WHALEFLUX_LOG_LEVEL="error")
    rng = random.Random(args.seed)
    started = time.monotonic()
    deadline = started + args.seconds
    tally = Tally()
    try:
        async with AsyncExitStack() as stack:
            svcs = {name: await stack.enter_async_context(running(name)) for name in SERVICES}
            for name, (client, _) in svcs.items():
                await fuzz_http(name, client, args.per_route, args.yaml, rng, tally, deadline)
            http_s = time.monotonic() - started
            bus = await Bus.connect(servers.nats_url, source="fuzz", user=servers.nats_user,
                                    password=servers.nats_password)
            stack.push_async_callback(bus.close)
            runtimes = {name: runtime for name, (_, runtime) in svcs.items()}
            bus_result = await fuzz_bus(bus, runtimes, args.per_subject, rng, deadline + args.seconds)
            ended = [f"{n}:{c}" for n, rt in runtimes.items() for c in rt.bus.ended_consumers()]
            alive = [n for n, (client, _) in svcs.items() if (await client.get("/healthz")).status_code == 200]
    finally:
        servers.stop()
    return report(args, tally, http_s, bus_result, ended, alive, time.monotonic() - started)


def report(args, tally: Tally, http_s: float, bus: dict, ended: list[str], alive: list[str], total_s: float) -> int:
    print(f"# fuzz run, seed {args.seed}: HTTP {http_s:.0f} s, all {total_s:.0f} s (a busy shared machine)")
    print(f"{'edge':58} {'sent':>6} {'4xx':>6} {'5xx':>5} {'2xx/3xx':>7} {'crash':>5}")
    for route, c in sorted(tally.by_route.items()):
        print(f"{route[:58]:58} {sum(c.values()):6} {c.get('4xx', 0):6} {c.get('5xx', 0):5} "
              f"{c.get('2xx/3xx', 0):7} {c.get('crash', 0):5}")
    print(f"HTTP: {len(tally.by_route)} routes, {sum(sum(c.values()) for c in tally.by_route.values())} requests, "
          f"4xx {tally.total('4xx')}, 5xx {tally.total('5xx')}, crashes {tally.total('crash')}")
    for line in tally.failures[:50]:
        print("  5xx/crash:", line)
    print(f"\n{'subject':40} {'sent':>6}")
    for subject, n in sorted(bus["sent"].items()):
        print(f"{subject:40} {n:6}")
    print(f"{'consumer':28} {'expected':>8} {'dead-lettered':>13}")
    for consumer, n in sorted(bus["expected"].items()):
        print(f"{consumer:28} {n:8} {bus['got'][consumer]:13}")
    missing = sum((bus["expected"] - bus["got"]).values())
    print(f"bus: {len(bus['sent'])} subjects, {sum(bus['sent'].values())} messages, dead letters "
          f"{sum(bus['got'].values())} of {sum(bus['expected'].values())} expected (stages {dict(bus['stages'])}), "
          f"missing {missing}; consumer loops ended: {ended or 0}; services answering: {len(alive)}/{len(SERVICES)}")
    bad = tally.total("5xx") + tally.total("crash") + missing + len(ended) + (len(SERVICES) - len(alive))
    print("RESULT:", "OK" if bad == 0 else "FAILURES")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-route", type=int, default=1000)
    parser.add_argument("--yaml", type=int, default=200)
    parser.add_argument("--per-subject", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=900)
    parser.add_argument("--seed", type=int, default=18)
    sys.exit(asyncio.run(main(parser.parse_args())))
