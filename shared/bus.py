"""A thin typed layer over nats-py JetStream: publish events, run durable consumers.

Delivery contract for every consumer:
- explicit ack after the handler succeeds;
- an event that is not valid (bad JSON, bad envelope, unknown type, schema
  violation) or that a handler rejects goes to `deadletter.<subject>` with the
  reason in a header, is counted, and is terminated (`term`) — it can never succeed;
- a handler error or `Retry` is nak'ed with the consumer's growing back-off; after its max_deliver
  attempts the event is dead-lettered;
- handled event ids are remembered in Redis, so a redelivered event is acked
  without running the handler twice.
No handler exception escapes the loop.

Batch consumers (a handler marked with `@batch_handler`, for high-rate feeds)
keep that contract per event: every message of a fetch is decoded and the
invalid ones dead-lettered one by one; the handler gets the valid events in one
call (so it can write them in one Redis round trip) and says per event whether
it was handled or raised Reject / Retry / another error, each settled as above.
If the batch handler itself raises, every event of the batch is handled again on
its own (a one-event batch), so one bad event cannot hold up the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError
from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.asyncio import Redis

from . import subjects
from .events import Envelope, EventData, InvalidEvent, decode, decode_typed, encode, make_envelope
from .streams import STREAMS, ConsumerSpec

log = structlog.get_logger("whaleflux.bus")

Handler = Callable[[Envelope, EventData], Awaitable[None]]
# Gets the valid events of one fetch, in stream order; returns one outcome per event
# (None: handled; Reject, Retry or another exception: settled like a raising handler),
# or None when all were handled.
BatchHandler = Callable[[list[tuple[Envelope, EventData]]], Awaitable["list[Exception | None] | None"]]
SEEN_TTL_S = 14 * 86400
REASON_HEADER = "WhaleFlux-Reason"


class Reject(Exception):
    """Raised by a handler for an event that is well-formed but can never be processed."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Retry(Exception):
    """Raised by a handler for transient trouble: redeliver later, dead-letter when out of tries."""

    def __init__(self, reason: str, delay_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


@dataclass
class BusMetrics:
    handled: Counter
    deadlettered: Counter
    errors: Counter
    duplicates: Counter
    latency: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BusMetrics:
        return cls(
            handled=Counter("whaleflux_events_handled", "Events handled", ["consumer", "type"], registry=registry),
            deadlettered=Counter(
                "whaleflux_events_deadlettered",
                "Events sent to deadletter.<subject>",
                ["consumer", "stage"],
                registry=registry,
            ),
            errors=Counter("whaleflux_handler_errors", "Handler failures (retried)", ["consumer"], registry=registry),
            duplicates=Counter("whaleflux_events_duplicate", "Redelivered events skipped", ["consumer"], registry=registry),
            latency=Histogram(
                "whaleflux_event_handle_seconds",
                "Time to handle one event",
                ["consumer"],
                registry=registry,
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            ),
        )


def batch_handler(fn):
    """Mark a handler as a BatchHandler: `Bus.start_consumer` then runs its consumer in batch mode."""
    fn.whaleflux_batch = True
    return fn


def is_batch_handler(handler) -> bool:
    return getattr(handler, "whaleflux_batch", False)


def _header_safe(text: str, limit: int = 1000) -> str:
    return " ".join(text.split())[:limit]


class Bus:
    """One NATS connection with JetStream, used by one process."""

    def __init__(self, nc: nats.NATS, source: str, metrics: BusMetrics | None = None):
        self.nc = nc
        self.js = nc.jetstream()
        self.source = source
        self.metrics = metrics or BusMetrics.create(CollectorRegistry())
        self.bound: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        source: str,
        user: str | None = None,
        password: str | None = None,
        metrics: BusMetrics | None = None,
        connect_timeout: float = 5.0,
        reconnect: bool = True,
    ) -> Bus:
        """Connect; services reconnect forever, a one-shot client (`reconnect=False`) fails fast."""
        bus = cls(nats.NATS(), source, metrics)
        await bus.nc.connect(
            url,
            user=user,
            password=password,
            name=source,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1 if reconnect else 0,
            reconnect_time_wait=1,
            allow_reconnect=reconnect,
            disconnected_cb=bus._on_disconnected,
            reconnected_cb=bus._on_reconnected,
            error_cb=bus._on_error,
        )
        return bus

    async def _on_disconnected(self) -> None:
        if not self._stopping.is_set():
            log.warning("nats.disconnected")

    async def _on_reconnected(self) -> None:
        log.info("nats.reconnected")

    async def _on_error(self, exc: Exception) -> None:
        if not self._stopping.is_set():
            log.warning("nats.error", error=type(exc).__name__)

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    async def ensure_streams(self) -> None:
        """Create or update every declared stream (idempotent)."""
        for spec in STREAMS.values():
            try:
                await self.js.add_stream(spec.config())
            except BadRequestError:
                await self.js.update_stream(spec.config())

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create the durable consumer if missing; one that exists keeps its position unless its
        filters or delivery limits changed (then it is replaced: a new config cannot keep a position)."""
        try:
            info = await self.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            info = None
        if info is not None:
            have, want = info.config, spec.config()
            if (sorted(have.filter_subjects or [have.filter_subject]) == sorted(spec.filter_subjects)
                    and have.max_deliver == want.max_deliver and have.max_ack_pending == want.max_ack_pending):
                return
            await self.js.delete_consumer(spec.stream, spec.durable)
        try:
            await self.js.add_consumer(spec.stream, spec.config())
        except BadRequestError:
            # Created meanwhile by another replica of the same service: use it.
            await self.js.consumer_info(spec.stream, spec.durable)

    async def reposition_consumer(self, spec: ConsumerSpec, start_seq: int) -> None:
        """Recreate the durable consumer so that it delivers from stream sequence `start_seq` on
        (after a rebuild that folded everything before it)."""
        try:
            await self.js.delete_consumer(spec.stream, spec.durable)
        except NotFoundError:
            pass
        config = spec.config()
        config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, max(start_seq, 1)
        await self.js.add_consumer(spec.stream, config)

    # ------------------------------------------------------------------ publish

    def envelope(self, data: EventData, *, subject: str | None = None, **kw) -> Envelope:
        return make_envelope(data, source=self.source, subject=subject, **kw)

    async def publish(self, nats_subject: str, data: EventData, **kw) -> Envelope:
        """Publish `data` in a new envelope; `kw` sets envelope attributes (subject, event_id, ...)."""
        env = self.envelope(data, **kw)
        await self.publish_envelope(nats_subject, env)
        return env

    async def publish_envelope(self, subject: str, env: Envelope) -> None:
        # Nats-Msg-Id makes a re-publish of the same event (outbox replay) a no-op.
        await self.js.publish(subject, encode(env), headers={"Nats-Msg-Id": env.id})

    async def deadletter(self, msg: Msg, consumer: str, stage: str, reason: str) -> None:
        seq = msg.metadata.sequence.stream if msg.metadata else None
        headers = {
            # One dead letter per original message, even if recording it is retried.
            **({"Nats-Msg-Id": f"dl-{consumer}-{seq}"} if seq is not None else {}),
            REASON_HEADER: _header_safe(reason),
            "WhaleFlux-Consumer": consumer,
            "WhaleFlux-Stage": stage,
            "WhaleFlux-Subject": msg.subject,
        }
        await self.js.publish(subjects.deadletter(msg.subject), msg.data, headers=headers)
        self.metrics.deadlettered.labels(consumer, stage).inc()
        log.warning("event.deadlettered", consumer=consumer, subject=msg.subject, stage=stage, reason=reason)

    # ------------------------------------------------------------------ consume

    def start_consumer(self, spec: ConsumerSpec, handler: Handler | BatchHandler, redis: Redis | None, seen_prefix: str,
                       gate: asyncio.Event | None = None) -> None:
        """Run a durable consumer; a handler marked `@batch_handler` gets each fetch's valid events at once.

        `gate`: fetch only while it is set (a service whose state store is down or being rebuilt
        takes no events meanwhile, so none is spent on retries it cannot win)."""
        if is_batch_handler(handler) and spec.dedup:
            # Batch mode has no per-event id dedup: only for handlers idempotent by nature.
            raise ValueError(f"consumer {spec.durable}: a batch handler needs dedup=False")
        self._tasks.append(asyncio.create_task(self._consume(spec, handler, redis, seen_prefix, gate), name=spec.durable))

    async def _consume(self, spec: ConsumerSpec, handler: Handler, redis: Redis | None, seen_prefix: str,
                       gate: asyncio.Event | None) -> None:
        # Batch mode handles one fetch while fetching the next; at most one batch is in
        # flight, so batches are still handled one after another, in stream order.
        batch_mode = is_batch_handler(handler)
        inflight: asyncio.Task | None = None
        psub = None
        try:
            while not self._stopping.is_set():
                if gate is not None and not gate.is_set():
                    if inflight is not None:
                        await inflight
                        inflight = None
                    await gate.wait()
                    # The state may have been rebuilt meanwhile, and the consumer recreated or moved.
                    if psub is not None:
                        await self._unbind(spec, psub)
                        psub = None
                try:
                    if psub is None:
                        await self.ensure_consumer(spec)
                        psub = await self.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
                        self.bound.add(spec.durable)
                    msgs = await psub.fetch(spec.batch, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                except asyncio.CancelledError:
                    raise
                except NotFoundError:
                    # Stream or consumer removed underneath us: declare again.
                    self.bound.discard(spec.durable)
                    psub = None
                    await asyncio.sleep(0.5)
                    continue
                except Exception as exc:  # connection trouble: keep trying, never die
                    log.warning("consumer.fetch_failed", consumer=spec.durable, error=repr(exc))
                    self.bound.discard(spec.durable)
                    psub = None
                    await asyncio.sleep(1.0)
                    continue
                if batch_mode:
                    if inflight is not None:
                        await inflight
                    inflight = asyncio.create_task(self._dispatch_batch(spec, msgs, handler))
                    if spec.linger_s and len(msgs) < spec.batch // 4:
                        await asyncio.sleep(spec.linger_s)
                    continue
                for msg in msgs:
                    await self._dispatch(spec, msg, handler, redis, seen_prefix)
        finally:
            if inflight is not None and not inflight.done():
                inflight.cancel()  # its unacked events are delivered again after ack_wait

    async def _unbind(self, spec: ConsumerSpec, psub) -> None:
        self.bound.discard(spec.durable)
        try:
            await psub.unsubscribe()
        except (TimeoutError, nats.errors.Error) as exc:
            log.info("consumer.unbind_failed", consumer=spec.durable, error=repr(exc))

    async def _dispatch(self, spec: ConsumerSpec, msg: Msg, handler: Handler, redis: Redis | None, prefix: str) -> None:
        name = spec.durable
        try:
            env, data = decode(msg.data)
        except InvalidEvent as exc:
            await self._settle_dead(msg, name, "validation", exc.reason)
            return

        seen_key = f"{prefix}:seen:{name}:{env.id}" if (spec.dedup and redis is not None) else None
        structlog.contextvars.bind_contextvars(event_id=env.id, correlation_id=env.correlationid)
        started = time.perf_counter()
        try:
            if seen_key and await redis.exists(seen_key):
                self.metrics.duplicates.labels(name).inc()
                await msg.ack()
                log.info("event.duplicate", consumer=name, type=env.type, subject=msg.subject)
                return
            await handler(env, data)
            if seen_key:
                await redis.set(seen_key, 1, ex=SEEN_TTL_S)
            await msg.ack()
            self.metrics.handled.labels(name, env.type).inc()
            elapsed = time.perf_counter() - started
            self.metrics.latency.labels(name).observe(elapsed)
            log.info("event.handled", consumer=name, type=env.type, subject=msg.subject, ms=round(elapsed * 1000, 2))
        except Reject as exc:
            await self._settle_dead(msg, name, "rejected", exc.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._retry_or_dead(msg, spec, exc)
        finally:
            structlog.contextvars.unbind_contextvars("event_id", "correlation_id")

    async def _dispatch_batch(self, spec: ConsumerSpec, msgs: list[Msg], handler: BatchHandler) -> None:
        name = spec.durable
        valid: list[tuple[Msg, Envelope, EventData]] = []
        for msg in msgs:
            try:
                # env.data is the typed model here (see decode_typed): same as `data`.
                env, data = decode_typed(msg.data)
            except InvalidEvent as exc:
                await self._settle_dead(msg, name, "validation", exc.reason)
                continue
            valid.append((msg, env, data))
        if not valid:
            return
        started = time.perf_counter()
        try:
            outcomes = await self._run_batch(handler, [(env, data) for _, env, data in valid])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("batch.failed", consumer=name, events=len(valid), error=repr(exc),
                        note="handling each event of the batch on its own")
            outcomes = []
            for _, env, data in valid:
                try:
                    outcomes += await self._run_batch(handler, [(env, data)])
                except asyncio.CancelledError:
                    raise
                except Exception as one:
                    outcomes.append(one)
        handled = 0
        for (msg, env, _), outcome in zip(valid, outcomes):
            if outcome is None:
                try:
                    await msg.ack()
                except Exception as exc:  # connection trouble: it comes again after ack_wait, handling is idempotent
                    log.warning("event.ack_failed", consumer=name, error=repr(exc))
                    continue
                self.metrics.handled.labels(name, env.type).inc()
                handled += 1
            elif isinstance(outcome, Reject):
                await self._settle_dead(msg, name, "rejected", outcome.reason)
            else:
                await self._retry_or_dead(msg, spec, outcome)
        elapsed = time.perf_counter() - started
        per_event = elapsed / len(valid)
        for _ in range(handled):
            self.metrics.latency.labels(name).observe(per_event)
        # One line per batch, not per event: at thousands of events a second the
        # lines themselves would cost as much as the handling (docs/bus.md).
        log.info("events.handled", consumer=name, handled=handled, events=len(valid), first_event_id=valid[0][1].id,
                 last_event_id=valid[-1][1].id, ms=round(elapsed * 1000, 2))

    @staticmethod
    async def _run_batch(handler: BatchHandler, events: list[tuple[Envelope, EventData]]) -> list[Exception | None]:
        outcomes = await handler(events)
        if outcomes is None:
            return [None] * len(events)
        if len(outcomes) != len(events):
            raise RuntimeError(f"batch handler returned {len(outcomes)} outcomes for {len(events)} events")
        return list(outcomes)

    async def _settle_dead(self, msg: Msg, consumer: str, stage: str, reason: str) -> None:
        try:
            await self.deadletter(msg, consumer, stage, reason)
            await msg.term()
        except Exception as exc:
            # Could not record it: leave it unacked so it is delivered again.
            log.error("deadletter.failed", consumer=consumer, error=repr(exc))

    async def _retry_or_dead(self, msg: Msg, spec: ConsumerSpec, exc: Exception) -> None:
        consumer = spec.durable
        self.metrics.errors.labels(consumer).inc()
        delivered = msg.metadata.num_delivered if msg.metadata else 1
        reason = exc.reason if isinstance(exc, Retry) else f"{type(exc).__name__}: {exc}"
        if delivered >= spec.max_deliver:
            await self._settle_dead(msg, consumer, "exhausted", f"failed {delivered} times; last: {reason}")
            return
        delay = exc.delay_s if isinstance(exc, Retry) and exc.delay_s else spec.delay_before(delivered)
        log.warning("event.retry", consumer=consumer, subject=msg.subject, attempt=delivered, delay_s=delay, reason=reason)
        try:
            await msg.nak(delay=delay)
        except Exception:
            pass

    async def close(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if not self.nc.is_closed:
            # Consumers are stopped and every ack was sent; drain() would wait out
            # its timeout on the pull subscriptions, so flush and close instead.
            try:
                await self.nc.flush(timeout=2)
            except Exception:
                pass
            await self.nc.close()
