"""Delivery contract of the bus, through a real NATS JetStream and Redis."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import nats

from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER, Bus, Reject, Retry, batch_handler
from whaleflux.shared.events import JobFinished, JobSubmitted
from whaleflux.shared.streams import ConsumerSpec, reports

from .processes import fetch_at_least, until

# Same delivery contract as the declared consumers, with short back-off so the test is quick.
SPEC = ConsumerSpec("test-bus", "WHALEFLUX_JOBS", [subjects.JOB_SUBMITTED], batch=8, backoff_s=(0.05, 0.05, 0.1))
MAX_DELIVER = SPEC.max_deliver


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, command=["true"])


async def deadletters(bus: Bus, n: int) -> list:
    sub = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", durable="test-dl",
                                      stream="WHALEFLUX_DEADLETTER")
    return await fetch_at_least(sub, n)


async def test_handler_errors_are_retried_and_dead_lettered_when_out_of_tries(bus_and_redis):
    bus, redis = bus_and_redis
    calls: dict[str, int] = {}
    handled: list[str] = []

    async def handler(env, data):
        calls[data.job_id] = calls.get(data.job_id, 0) + 1
        if data.job_id == "always-fails":
            raise Retry("downstream unavailable")
        if data.job_id == "boom" and calls["boom"] == 1:
            raise RuntimeError("transient bug")
        if data.job_id == "refused":
            raise Reject("cannot ever work")
        handled.append(data.job_id)

    bus.start_consumer(SPEC, handler, redis, "wf:test")
    for job_id in ("always-fails", "boom", "refused", "fine"):
        await bus.publish(subjects.JOB_SUBMITTED, job(job_id))
    await until(lambda: set(handled) == {"boom", "fine"} and calls.get("always-fails") == MAX_DELIVER)

    dead = await deadletters(bus, 2)
    reasons = sorted(m.headers[REASON_HEADER] for m in dead)
    assert reasons[0] == "cannot ever work"
    assert reasons[1].startswith(f"failed {MAX_DELIVER} times; last: downstream unavailable")
    assert all(m.subject == "deadletter.job.submitted" for m in dead)
    assert calls["boom"] == 2 and calls["refused"] == 1
    assert bus.metrics.deadlettered.labels("test-bus", "exhausted")._value.get() == 1
    assert bus.metrics.deadlettered.labels("test-bus", "rejected")._value.get() == 1


async def test_a_redelivered_event_is_not_handled_twice(bus_and_redis):
    bus, redis = bus_and_redis
    seen: list[str] = []

    async def handler(env, data):
        seen.append(env.id)

    env = bus.envelope(job("dup"), event_id="evt-1")
    bus.start_consumer(SPEC, handler, redis, "wf:test")
    await bus.publish_envelope(subjects.JOB_SUBMITTED, env)
    await until(lambda: seen == ["evt-1"])
    # Same event published again past JetStream's own dedup (other Nats-Msg-Id): the handler's dedup catches it.
    await bus.js.publish(subjects.JOB_SUBMITTED, env.model_dump_json().encode(), headers={"Nats-Msg-Id": "other"})
    await bus.publish(subjects.JOB_SUBMITTED, job("after"))
    await until(lambda: len(seen) == 2)
    assert seen[0] == "evt-1" and seen[1] != "evt-1"
    assert bus.metrics.duplicates.labels("test-bus")._value.get() == 1


async def test_an_event_a_handler_can_never_take_is_dead_lettered_at_its_first_delivery(bus_and_redis):
    """A handler error that depends only on the event (Redis' `hset with no key value pairs`, the OS's
    `embedded null byte`) is not retried: every try would fail the same way."""
    bus, redis = bus_and_redis
    calls: dict[str, int] = {}
    handled: list[str] = []

    async def handler(env, data):
        calls[data.job_id] = calls.get(data.job_id, 0) + 1
        if data.job_id == "empty-hash":
            await redis.hset("wf:test:h", mapping={})  # redis-py: DataError
        if data.job_id == "nul-path":
            os.stat("bad\x00path")  # ValueError: embedded null byte
        handled.append(data.job_id)

    bus.start_consumer(SPEC, handler, redis, "wf:test")
    for job_id in ("empty-hash", "nul-path", "fine"):
        await bus.publish(subjects.JOB_SUBMITTED, job(job_id))
    dead = await deadletters(bus, 2)
    await until(lambda: handled == ["fine"])
    reasons = sorted(m.headers[REASON_HEADER] for m in dead)
    assert reasons[0].startswith("can never be processed: DataError") and "hset" in reasons[0]
    assert reasons[1] == "can never be processed: ValueError: embedded null byte"
    assert calls == {"empty-hash": 1, "nul-path": 1, "fine": 1}
    assert bus.metrics.deadlettered.labels("test-bus", "rejected")._value.get() == 2
    assert bus.metrics.deadlettered.labels("test-bus", "exhausted")._value.get() == 0


async def test_an_event_naming_another_node_than_its_subject_is_dead_lettered_at_once(bus_and_redis):
    """NATS permits a node's identity its own nodes' subjects only; the consumer holds the data to the subject, so
    an agent cannot report about another node's job from its own subject. A bare report (older history) is taken."""
    bus, redis = bus_and_redis
    handled: dict[str, list[str]] = {"one": [], "batch": []}

    async def one(env, data):
        handled["one"].append(data.job_id)

    @batch_handler
    async def batch(events):
        handled["batch"] += [data.job_id for _, data in events]

    for name, handler in (("one", one), ("batch", batch)):
        spec = ConsumerSpec(f"test-{name}", "WHALEFLUX_JOBS", list(reports(subjects.JOB_FINISHED)),
                            dedup=name == "one")
        bus.start_consumer(spec, handler, redis, "wf:test")

    def finished(job_id: str, node: str) -> JobFinished:
        now = datetime.now(UTC)
        return JobFinished(job_id=job_id, attempt=1, cluster="c1", node=node, exit_code=0, started_at=now,
                           finished_at=now)

    await bus.publish(subjects.job_finished("c1", "n2"), finished("forged", "n1"))
    await bus.publish(subjects.job_finished("c1", "n1"), finished("own", "n1"))
    await bus.publish(subjects.JOB_FINISHED, finished("old-history", "n1"))
    dead = await deadletters(bus, 2)
    await until(lambda: all(sorted(got) == ["old-history", "own"] for got in handled.values()))
    assert sorted(m.headers["WhaleFlux-Consumer"] for m in dead) == ["test-batch", "test-one"]
    assert {(m.subject, m.headers["WhaleFlux-Stage"], m.headers[REASON_HEADER]) for m in dead} == {
        ("deadletter.job.finished.c1.n2", "validation", "subject names node c1/n2 but data names c1/n1")}


async def test_the_schedulers_rebuild_reads_bare_history_and_skips_a_report_naming_another_node(bus_and_redis):
    """The rebuild reads the stream itself, not through a consumer: it holds the data to the subject the same way."""
    from whaleflux.scheduler.rebuild import JOB_HISTORY, read_stream

    bus, _ = bus_and_redis
    now = datetime.now(UTC)
    for job_id, subject, node in (("forged", subjects.job_finished("c1", "n2"), "n1"),
                                  ("own", subjects.job_finished("c1", "n1"), "n1"),
                                  ("old-history", subjects.JOB_FINISHED, "n1")):
        await bus.publish(subject, JobFinished(job_id=job_id, attempt=1, cluster="c1", node=node, exit_code=0,
                                               started_at=now, finished_at=now))
    read = [getattr(data, "job_id", None) async for _, _, data in read_stream(bus, "WHALEFLUX_JOBS", JOB_HISTORY)]
    assert read == ["own", "old-history"]


def test_the_bus_times_the_envelopes_it_makes_by_its_clock():
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    bus = Bus(nats.NATS(), "whaleflux/test/1", clock=lambda: t0)
    env = bus.envelope(job("j"), subject="j")
    assert env.time == t0 and env.source == "whaleflux/test/1" and env.subject == "j"


async def test_a_consumer_whose_filters_change_keeps_its_position(bus_and_redis):
    """An upgrade that widens a consumer's filters (bare job reports -> node-scoped ones too) updates it in
    place: what it handled before is not delivered again, and the new subjects arrive."""
    bus, redis = bus_and_redis
    handled: list[str] = []

    async def handler(env, data):
        handled.append(data.job_id)

    old = ConsumerSpec("test-widened", "WHALEFLUX_JOBS", [subjects.JOB_SUBMITTED], batch=8)
    bus.start_consumer(old, handler, redis, "wf:test")
    for job_id in ("a", "b"):
        await bus.publish(subjects.JOB_SUBMITTED, job(job_id))
    await until(lambda: handled == ["a", "b"])
    await bus.stop_consumer("test-widened")
    before = await bus.js.consumer_info("WHALEFLUX_JOBS", "test-widened")

    new = ConsumerSpec("test-widened", "WHALEFLUX_JOBS", [subjects.JOB_SUBMITTED, f"{subjects.JOB_CANCELLED}.>"],
                       batch=8, max_ack_pending=before.config.max_ack_pending + 1)
    await bus.ensure_consumer(new)
    after = await bus.js.consumer_info("WHALEFLUX_JOBS", "test-widened")
    assert sorted(after.config.filter_subjects) == sorted(new.filter_subjects)
    assert after.config.max_ack_pending == new.max_ack_pending
    assert after.delivered.stream_seq == before.delivered.stream_seq, "the position is kept"
    bus.start_consumer(new, handler, redis, "wf:test")
    await bus.publish(subjects.JOB_SUBMITTED, job("c"))
    await until(lambda: "c" in handled)
    assert handled == ["a", "b", "c"], "nothing handled before came again"
