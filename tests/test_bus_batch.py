"""Batch consumers (`@batch_handler`): the per-event delivery contract holds when a handler gets a whole fetch."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER, Reject, batch_handler
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuTelemetry, JobSubmitted, NodeRegistered, make_envelope
from whaleflux.shared.streams import ConsumerSpec
from whaleflux.telemetry.app import LatestSample, TelemetryService, TelemetrySettings
from whaleflux.telemetry.history import Point
from whaleflux.telemetry.store import latest_entries

from .processes import until
from .test_bus import deadletters

SPEC = ConsumerSpec("test-batch", "WHALEFLUX_JOBS", [subjects.JOB_SUBMITTED], batch=16, backoff_s=(0.05, 0.05, 0.1),
                    dedup=False)


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, command=["true"])


async def test_invalid_and_rejected_events_of_a_batch_are_dead_lettered_and_the_rest_handled(bus_and_redis):
    bus, redis = bus_and_redis
    calls: list[list[str]] = []
    handled: list[str] = []

    @batch_handler
    async def handler(events):
        ids = [data.job_id for _, data in events]
        calls.append(ids)
        outcomes: list[Exception | None] = []
        for job_id in ids:
            if job_id == "refused":
                outcomes.append(Reject("cannot ever work"))
            elif job_id == "flaky" and sum(c.count("flaky") for c in calls) == 1:
                outcomes.append(RuntimeError("transient"))
            else:
                handled.append(job_id)
                outcomes.append(None)
        return outcomes

    # All in the stream before the consumer starts, so they arrive in one fetch.
    await bus.publish(subjects.JOB_SUBMITTED, job("a"))
    await bus.js.publish(subjects.JOB_SUBMITTED, b"\x00not json{")
    for job_id in ("refused", "flaky", "b"):
        await bus.publish(subjects.JOB_SUBMITTED, job(job_id))
    bus.start_consumer(SPEC, handler, redis, "wf:test")
    await until(lambda: sorted(handled) == ["a", "b", "flaky"])

    assert calls[0] == ["a", "refused", "flaky", "b"]  # one call for the valid events of the fetch
    assert calls[1] == ["flaky"]  # only the failed one came back, after its back-off
    dead = await deadletters(bus, 2)
    assert sorted(m.headers[REASON_HEADER] for m in dead)[0] == "cannot ever work"
    assert sorted(m.headers[REASON_HEADER] for m in dead)[1].startswith("not JSON")
    assert bus.metrics.deadlettered.labels("test-batch", "validation")._value.get() == 1
    assert bus.metrics.deadlettered.labels("test-batch", "rejected")._value.get() == 1
    assert bus.metrics.handled.labels("test-batch", JobSubmitted.event_type())._value.get() == 3
    assert bus.metrics.errors.labels("test-batch")._value.get() == 1


async def test_a_raising_batch_handler_falls_back_to_one_event_at_a_time_and_loses_nothing(bus_and_redis):
    bus, redis = bus_and_redis
    sizes: list[int] = []
    handled: list[str] = []

    @batch_handler
    async def handler(events):
        sizes.append(len(events))
        if any(data.job_id == "poison" for _, data in events):
            raise RuntimeError("poison pill")
        handled.extend(data.job_id for _, data in events)

    for job_id in ("a", "poison", "b", "c"):
        await bus.publish(subjects.JOB_SUBMITTED, job(job_id))
    bus.start_consumer(SPEC, handler, redis, "wf:test")
    await until(lambda: bus.metrics.deadlettered.labels("test-batch", "exhausted")._value.get() == 1)

    assert sorted(handled) == ["a", "b", "c"] and len(handled) == 3  # each good event handled exactly once
    assert sizes[:5] == [4, 1, 1, 1, 1]  # the batch, then each event on its own
    [dead] = await deadletters(bus, 1)
    assert dead.headers[REASON_HEADER].startswith(f"failed {SPEC.max_deliver} times; last: RuntimeError: poison pill")


async def test_batch_mode_refuses_a_consumer_that_relies_on_id_dedup(bus_and_redis):
    bus, redis = bus_and_redis

    @batch_handler
    async def handler(events):
        return None

    with pytest.raises(ValueError, match="dedup=False"):
        bus.start_consumer(ConsumerSpec("x", "WHALEFLUX_JOBS", [subjects.JOB_SUBMITTED]), handler, redis, "wf:test")


async def test_telemetry_batch_judges_each_node_batch_in_order_and_stores_the_rest_in_one_go(env):
    t0 = datetime.now(UTC).replace(microsecond=0)
    svc = TelemetryService(TelemetrySettings(maintenance_interval_s=3600))
    await asyncio.wait_for(svc._start(), 15)  # fail, not hang, if the servers are unreachable
    try:
        node = SimulatedNode("h100-01", gpu_models()["H100"], 2)
        reg = NodeRegistered(cluster="onprem", node="h100-01", agent_version="t", gpus=node.identities())
        await svc.on_registered(make_envelope(reg, source="t", time=t0), reg)

        def batch(seq: int, dt: int) -> tuple:
            b = GpuTelemetry(cluster="onprem", node="h100-01", seq=seq, sample_time=t0 + timedelta(seconds=dt),
                             gpus=node.sample(t0 + timedelta(seconds=dt)))
            return make_envelope(b, source="t", time=b.sample_time), b

        ghost = GpuTelemetry(cluster="onprem", node="ghost", seq=1, sample_time=t0, gpus=node.sample(t0))
        ghost_event = (make_envelope(ghost, source="t", time=t0), ghost)
        events = [batch(1, 0), batch(2, 1), batch(2, 1), batch(3, 2), ghost_event, batch(1, 0)]
        outcomes = await svc.on_telemetry_batch(events)

        assert outcomes[0] is None and outcomes[1] is None and outcomes[3] is None
        assert isinstance(outcomes[2], Reject) and outcomes[2].reason.startswith("duplicate_seq: seq 2")
        assert type(outcomes[4]).__name__ == "Retry"  # node not registered (yet)
        assert isinstance(outcomes[5], Reject) and outcomes[5].reason.startswith("out_of_order: seq 1")
        latest = await svc.latest()
        assert [(s.seq, s.gpu.index) for s in latest] == [(3, 0), (3, 1)]
        uuid = node.identities()[0].uuid
        assert await svc.redis.zcard(svc._k("raw", uuid)) == 3
        assert svc.stored._value.get() == 6
        assert await svc.redis.hget(svc._k("seq"), "onprem/h100-01") == f"3 {(t0 + timedelta(seconds=2)).timestamp()}"

        # A GPU missing from its node's batch keeps its last sample (so it shows as stale); back, it is current again.
        t3 = t0 + timedelta(seconds=3)
        partial = GpuTelemetry(cluster="onprem", node="h100-01", seq=4, sample_time=t3, gpus=node.sample(t3)[:1])
        assert await svc.on_telemetry_batch([(make_envelope(partial, source="t", time=t3), partial)]) == [None]
        assert [(s.seq, s.gpu.index) for s in await svc.latest()] == [(4, 0), (3, 1)]
        assert (await svc.statuses())[1].sample_time == (t0 + timedelta(seconds=2)).isoformat()
        assert await svc.on_telemetry_batch([batch(5, 4)]) == [None]
        assert [(s.seq, s.gpu.index) for s in await svc.latest()] == [(5, 0), (5, 1)]
        assert await svc.redis.hlen(svc._k("gone")) == 0
    finally:
        await svc.stop()


def test_cheap_encodings_match_the_models():
    t = datetime(2026, 12, 1, tzinfo=UTC)
    node = SimulatedNode("h100-01", gpu_models()["H100"], 2, interconnect="nvlink")
    node.job_started([node.identities()[0].uuid], "j", pid=7)
    data = GpuTelemetry(cluster="onprem", node="h100-01", seq=9, sample_time=t, gpus=node.sample(t))
    entries = latest_entries(data)
    for g in data.gpus:
        model = LatestSample(cluster="onprem", node="h100-01", seq=9, sample_time=t.isoformat(), gpu=g)
        assert entries[g.uuid] == model.model_dump_json()
        assert Point.encode_sample(t.timestamp(), g) == Point.of(t.timestamp(), g).encode()
    odd = data.gpus[1].model_copy(update={"power_w": float("inf"), "energy_j": None, "utilization_gpu_pct": 7})
    assert Point.encode_sample(1.5, odd) == Point.of(1.5, odd).encode()
