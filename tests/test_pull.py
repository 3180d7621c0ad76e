"""The bus's pull fetch (`shared/pull.py`) against a real nats-server: a trickle handed over at once, a
backlog in full batches in stream order, an idle fetch empty, a consumer that is gone said so."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import ServiceUnavailableError

from whaleflux.shared import subjects
from whaleflux.shared.events import JobSubmitted
from whaleflux.shared.pull import Puller

STREAM, DURABLE = "WHALEFLUX_JOBS", "test-pull"


async def _puller(bus) -> Puller:
    await bus.js.add_consumer(STREAM, ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                                     filter_subject=subjects.JOB_SUBMITTED, max_ack_pending=1000))
    puller = Puller(bus.nc, STREAM, DURABLE)
    await puller.bind()
    return puller


async def _publish(bus, *job_ids: str) -> None:
    for job_id in job_ids:
        await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(job_id=job_id, name=job_id, command=["true"]))


def _job_ids(msgs) -> list[str]:
    import json

    return [json.loads(m.data)["data"]["job_id"] for m in msgs]


async def test_a_fetch_waiting_on_an_empty_consumer_hands_over_the_first_event_without_waiting_for_a_batch(
        bus_and_redis):
    bus, _ = bus_and_redis
    puller = await _puller(bus)
    waiting = asyncio.create_task(puller.fetch(64, timeout=60.0))
    await asyncio.sleep(0)  # the request is out before the event
    await _publish(bus, "first")
    # Held for a full batch, the fetch would wait out its 60 s; the guard is far shorter.
    msgs = await asyncio.wait_for(waiting, 20.0)
    assert _job_ids(msgs) == ["first"]
    await puller.unsubscribe()


async def test_a_backlog_comes_in_full_batches_in_stream_order_each_event_once(bus_and_redis):
    bus, _ = bus_and_redis
    puller = await _puller(bus)
    sent = [f"j{i:03d}" for i in range(300)]
    await _publish(bus, *sent)
    sizes: list[int] = []
    got: list[str] = []
    while len(got) < len(sent):
        msgs = await puller.fetch(128, timeout=5.0)
        assert msgs, f"an empty fetch with {len(sent) - len(got)} events left"
        sizes.append(len(msgs))
        got += _job_ids(msgs)
        for m in msgs:
            await m.ack()
    assert sizes == [128, 128, 44] and got == sent
    assert await puller.fetch(128, timeout=0.2) == []  # nothing left: an idle fetch is empty
    await bus.nc.flush()
    info = await bus.js.consumer_info(STREAM, DURABLE)
    assert info.num_pending == 0 and info.num_ack_pending == 0
    await puller.unsubscribe()


async def test_a_consumer_that_is_gone_is_said_to_be_unavailable(bus_and_redis):
    bus, _ = bus_and_redis
    puller = await _puller(bus)
    await bus.js.delete_consumer(STREAM, DURABLE)
    with pytest.raises(ServiceUnavailableError):
        await puller.fetch(8, timeout=5.0)
    await puller.unsubscribe()


async def test_a_bus_consumer_whose_durable_is_deleted_declares_it_again_and_goes_on(bus_and_redis):
    from whaleflux.shared.streams import ConsumerSpec

    from .processes import until

    bus, redis = bus_and_redis
    spec = ConsumerSpec("test-pull-bus", STREAM, [subjects.JOB_SUBMITTED], batch=8)
    handled: list[str] = []

    async def handler(env, data):
        handled.append(data.job_id)

    bus.start_consumer(spec, handler, redis, "wf:test")
    await _publish(bus, "before")
    await until(lambda: handled == ["before"], what="the first event handled")
    await bus.js.delete_consumer(STREAM, spec.durable)
    await _publish(bus, "after")
    # Declared again from the stream's start: "before" comes again and is acked as a duplicate (id dedup).
    await until(lambda: "after" in handled, timeout=30.0, what="the event published after the deletion")
    assert handled == ["before", "after"]
    assert bus.metrics.duplicates.labels(spec.durable)._value.get() == 1
