"""Every subject a service consumes, fuzzed with messages that can never be valid, through all five services on
real NATS and Redis: each bad message is dead-lettered by every consumer of its subject at its first delivery,
with its reason; no consumer loop ends; good traffic sent among the bad is still handled (issue 18, 5).

A few messages per subject here (seeded); bench/fuzz.py sends thousands.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER, Bus
from whaleflux.shared.events import REGISTRY, GpuIdentity, GpuSample, GpuTelemetry, NodeRegistered, make_envelope
from whaleflux.shared.streams import CONSUMERS

from .fuzzing import example, malformed_events
from .processes import connect_bus, fetch_at_least, until
from .test_fuzz import SERVICES, running

PER_SUBJECT = 6
SEED = 18


def concrete(filter_subject: str) -> str:
    """A subject a filter matches: `*` and `>` become tokens."""
    return filter_subject.replace(">", "fz.n1").replace("*", "fz")


def matches(filter_subject: str, subject: str) -> bool:
    want, got = filter_subject.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or token not in ("*", got[i]):
            return False
    return len(want) == len(got)


def base_envelope(subject: str) -> dict[str, Any]:
    """A valid envelope of the event the subject carries (built from the model's schema), to damage."""
    model = next((m for m in REGISTRY.values() if subject.startswith(m.event_name)), REGISTRY[
        next(iter(REGISTRY))])
    schema = model.model_json_schema(ref_template="#/$defs/{model}")
    data = model.model_validate(example(schema, schema))
    return json.loads(make_envelope(data, source="fuzz", time=datetime(2026, 1, 1, tzinfo=UTC)).wire())


def good_node() -> tuple[str, NodeRegistered, str, GpuTelemetry]:
    gpu = GpuIdentity(uuid="GPU-fz-good-0", index=0, model="A100", name="NVIDIA A100-SXM4-80GB",
                      memory_total_mib=81920)
    sample = GpuSample(uuid=gpu.uuid, index=0, model="A100", utilization_gpu_pct=7, memory_used_mib=100,
                       memory_total_mib=81920, temperature_c=33)
    return (subjects.node_registered("fz", "good"),
            NodeRegistered(cluster="fz", node="good", agent_version="fuzz", gpus=[gpu]),
            subjects.gpu_telemetry("fz", "good"),
            GpuTelemetry(cluster="fz", node="good", seq=1, sample_time=datetime.now(UTC), gpus=[sample]))


async def publish_bad(bus: Bus, consumed: list[str], rng: random.Random) -> dict[str, int]:
    """PER_SUBJECT bad messages on each subject; the good node's events in the middle. Returns how many per subject."""
    sent: dict[str, int] = {}
    reg_subject, registered, tel_subject, telemetry = good_node()
    for i, subject in enumerate(consumed):
        base = base_envelope(subject)
        for _ in range(PER_SUBJECT):
            await bus.js.publish(subject, malformed_events(base, rng))
        sent[subject] = PER_SUBJECT
        if i == len(consumed) // 2:
            await bus.publish(reg_subject, registered)
            await bus.publish(tel_subject, telemetry)
    return sent


async def test_every_consumed_subject_dead_letters_every_bad_message_at_once_and_good_traffic_flows(env):
    rng = random.Random(SEED)
    async with AsyncExitStack() as stack:
        started = {name: await stack.enter_async_context(running(name)) for name in SERVICES}
        clients = {name: client for name, (client, _) in started.items()}
        runtimes = {name: runtime for name, (_, runtime) in started.items()}
        running_consumers = {c: CONSUMERS[c] for rt in runtimes.values() for c in rt.consumer_specs()}
        consumed = sorted({concrete(f) for spec in running_consumers.values() for f in spec.filter_subjects})
        bus = await connect_bus(env)
        stack.push_async_callback(bus.close)
        sent = await publish_bad(bus, consumed, rng)

        expected = Counter({name: sum(n for subject, n in sent.items()
                                      if any(matches(f, subject) for f in spec.filter_subjects))
                            for name, spec in running_consumers.items()})
        dead_sub = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", durable="fuzz-dl",
                                               stream="WHALEFLUX_DEADLETTER")
        dead = await fetch_at_least(dead_sub, sum(expected.values()), timeout=120)
        got = Counter(m.headers["WhaleFlux-Consumer"] for m in dead)
        assert got == expected, f"dead letters per consumer {dict(got)} != {dict(expected)}"
        assert {m.headers["WhaleFlux-Stage"] for m in dead} == {"validation"}  # at once: never "exhausted"
        assert all(m.headers[REASON_HEADER] for m in dead)

        # Good traffic among the bad was handled: the node is known to telemetry, with its sample.
        async def good_sample() -> bool:
            r = await clients["telemetry"].get("/v1/gpus/GPU-fz-good-0")
            return r.status_code == 200 and r.json()["gpu"]["temperature_c"] == 33
        await until(good_sample, timeout=60, what="the good sample stored")
        for name, runtime in runtimes.items():
            assert runtime.bus.ended_consumers() == [], f"{name}: a consumer loop ended"
            assert (await clients[name].get("/readyz")).status_code == 200, name
