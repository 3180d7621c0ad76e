"""One durable pull consumer's delivery loop: fetch, decode, dedup, handle, ack / nak / dead-letter.

The delivery contract is in `shared.bus`'s docstring; `Bus.start_consumer` runs one of these per consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from redis.exceptions import DataError

from .dedup_store import SeenStore
from .events import Envelope, EventData, InvalidEvent, decode, decode_typed, misaddressed
from .handlers import BatchHandler, Handler, Reject, Retry, is_batch_handler
from .pull import Puller
from .streams import ConsumerSpec

if TYPE_CHECKING:
    from .bus import Bus

log = structlog.get_logger("whaleflux.bus")
_NATS_TROUBLE = (nats.errors.Error, OSError, TimeoutError)
# Handler errors that depend only on the event (a value the handler or Redis cannot take: `embedded null
# byte`, `hset with no key value pairs`): dead-lettered at once, like a Reject, not after max_deliver tries.
PERMANENT: tuple[type[Exception], ...] = (ValueError, TypeError, UnicodeError, RecursionError, DataError)


class Consumer:
    """Runs `handler` over the durable consumer `spec`, fetching only while `gate` is set (if given)."""

    def __init__(self, bus: Bus, spec: ConsumerSpec, handler: Handler | BatchHandler, seen: SeenStore | None,
                 gate: asyncio.Event | None) -> None:
        self.bus = bus
        self.spec = spec
        self.name = spec.durable
        self.handler = handler
        self.seen = seen if spec.dedup else None
        self.gate = gate
        self.batch_mode = is_batch_handler(handler)
        self.psub: Puller | None = None
        # Batch mode handles one fetch while fetching and decoding the next; at most one batch
        # is in flight, so batches are still handled one after another, in stream order.
        self.inflight: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask the loop to end after the fetch it is handling (handed over: nothing left unacked by choice)."""
        self._stop.set()

    async def run(self) -> None:
        try:
            while not self.bus.stopping and not self._stop.is_set():
                await self._wait_gate()
                if self._stop.is_set():
                    break
                msgs = await self._fetch()
                if msgs is None:
                    continue
                if self.batch_mode:
                    valid = await self._decode_batch(msgs)  # while the batch in flight waits on its store
                    await self._settle_inflight()
                    if valid:
                        self.inflight = asyncio.create_task(self._handle_batch(valid))
                    if self.spec.linger_s and len(msgs) < self.spec.batch // 4:
                        await asyncio.sleep(self.spec.linger_s)
                    continue
                for msg in msgs:
                    await self._dispatch(msg)
            await self._settle_inflight()  # asked to stop: the batch in hand is handled and acked first
            await self._unbind()
        finally:
            if self.inflight is not None and not self.inflight.done():
                self.inflight.cancel()  # its unacked events are delivered again after ack_wait

    async def _settle_inflight(self) -> None:
        if self.inflight is not None:
            await self.inflight
            self.inflight = None

    async def _wait_gate(self) -> None:
        if self.gate is None or self.gate.is_set():
            return
        await self._settle_inflight()
        waits = [asyncio.ensure_future(self._stop.wait()), asyncio.ensure_future(self.gate.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self._stop.is_set():
            return
        # The state may have been rebuilt meanwhile, and the consumer recreated or moved.
        if self.psub is not None:
            await self._unbind()

    async def _fetch(self) -> list[Msg] | None:
        """The next fetch; None when there was nothing (or trouble, after a pause: never die)."""
        try:
            if self.psub is None:
                await self.bus.ensure_consumer(self.spec)
                if self.spec.takeover:
                    await self._await_redeliveries()
                puller = Puller(self.bus.nc, self.spec.stream, self.name)
                await puller.bind()
                self.psub = puller
                self.bus.bound.add(self.name)
            return await self.psub.fetch(self.spec.batch, timeout=1.0) or None  # None: an idle fetch
        except (TimeoutError, nats.errors.TimeoutError):
            # Declaring the consumer timed out (a JetStream leader being elected): say so, never retry silently.
            log.warning("consumer.bind_failed", consumer=self.name, error="timeout")
            pause = 1.0
        except NotFoundError:
            # Stream or consumer removed underneath us: declare again.
            pause = 0.5
        except Exception as exc:  # noqa: BLE001 - connection trouble of any kind: keep trying, never die
            log.warning("consumer.fetch_failed", consumer=self.name, error=repr(exc))
            pause = 1.0
        await self._unbind()  # the failed subscription too: a new one is bound on the next fetch
        await asyncio.sleep(pause)
        return None

    async def _await_redeliveries(self) -> None:
        """Events the previous holder fetched and never acked are redelivered once their ack_wait passed:
        wait that long, so that they come first (JetStream delivers redeliveries before new events)."""
        info = await self.bus.js.consumer_info(self.spec.stream, self.name)
        if info.num_ack_pending:
            log.info("consumer.takeover_wait", consumer=self.name, unacked=info.num_ack_pending,
                     wait_s=self.spec.ack_wait_s)
            await asyncio.sleep(self.spec.ack_wait_s)

    async def _unbind(self) -> None:
        self.bus.bound.discard(self.name)
        psub, self.psub = self.psub, None
        try:
            if psub is not None:
                await psub.unsubscribe()
        except _NATS_TROUBLE as exc:
            log.info("consumer.unbind_failed", consumer=self.name, error=repr(exc))

    # ------------------------------------------------------------------ one event at a time

    async def _dispatch(self, msg: Msg) -> None:
        try:
            env, data = decode(msg.data)
            misaddressed(msg.subject, data)
        except InvalidEvent as exc:
            await self._settle_dead(msg, "validation", exc.reason)
            return
        structlog.contextvars.bind_contextvars(event_id=env.id, correlation_id=env.correlationid)
        started = time.perf_counter()
        try:
            await self._handle_once(msg, env, data, started)
        except Reject as exc:
            await self._settle_dead(msg, "rejected", exc.reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            await self._retry_or_dead(msg, exc)
        finally:
            structlog.contextvars.unbind_contextvars("event_id", "correlation_id")

    async def _handle_once(self, msg: Msg, env: Envelope, data: EventData, started: float) -> None:
        metrics = self.bus.metrics
        if self.seen is not None and await self.seen.seen(env.id):
            metrics.duplicates.labels(self.name).inc()
            await msg.ack()
            log.info("event.duplicate", consumer=self.name, type=env.type, subject=msg.subject)
            return
        handler: Handler = self.handler  # type: ignore[assignment]  # not batch mode
        await handler(env, data)
        if self.seen is not None:
            await self.seen.mark(env.id)
        await msg.ack()
        metrics.handled.labels(self.name, env.type).inc()
        elapsed = time.perf_counter() - started
        metrics.latency.labels(self.name).observe(elapsed)
        log.info("event.handled", consumer=self.name, type=env.type, subject=msg.subject, ms=round(elapsed * 1000, 2))

    # ------------------------------------------------------------------ a fetch at a time

    async def _decode_batch(self, msgs: list[Msg]) -> list[tuple[Msg, Envelope, EventData]]:
        """The valid events of a fetch; each invalid one dead-lettered."""
        valid: list[tuple[Msg, Envelope, EventData]] = []
        for msg in msgs:
            try:
                # env.data is the typed model here (see decode_typed): same as `data`.
                env, data = decode_typed(msg.data)
                misaddressed(msg.subject, data)
            except InvalidEvent as exc:
                await self._settle_dead(msg, "validation", exc.reason)
                continue
            valid.append((msg, env, data))
        return valid

    async def _handle_batch(self, valid: list[tuple[Msg, Envelope, EventData]]) -> None:
        started = time.perf_counter()
        outcomes = await self._outcomes([(env, data) for _, env, data in valid])
        handled: Counter[str] = Counter()  # per event type, counted once per batch
        for (msg, env, _), outcome in zip(valid, outcomes, strict=True):
            if outcome is None:
                try:
                    await msg.ack()
                except _NATS_TROUBLE as exc:  # it comes again after ack_wait, handling is idempotent
                    log.warning("event.ack_failed", consumer=self.name, error=repr(exc))
                    continue
                handled[env.type] += 1
            elif isinstance(outcome, Reject):
                await self._settle_dead(msg, "rejected", outcome.reason)
            else:
                await self._retry_or_dead(msg, outcome)
        elapsed = time.perf_counter() - started
        for event_type, n in handled.items():
            self.bus.metrics.handled.labels(self.name, event_type).inc(n)
        latency = self.bus.metrics.latency.labels(self.name)
        for _ in range(handled.total()):
            latency.observe(elapsed / len(valid))
        # One line per batch, not per event: at thousands of events a second the
        # lines themselves would cost as much as the handling (docs/bus.md).
        log.info("events.handled", consumer=self.name, handled=handled.total(), events=len(valid),
                 first_event_id=valid[0][1].id, last_event_id=valid[-1][1].id, ms=round(elapsed * 1000, 2))

    async def _outcomes(self, events: list[tuple[Envelope, EventData]]) -> list[Exception | None]:
        """One outcome per event; if the batch handler raises, each event is handled again on its own."""
        try:
            return await self._run_batch(events)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed batch is retried event by event
            log.warning("batch.failed", consumer=self.name, events=len(events), error=repr(exc),
                        note="handling each event of the batch on its own")
        outcomes: list[Exception | None] = []
        for event in events:
            try:
                outcomes += await self._run_batch([event])
            except asyncio.CancelledError:
                raise
            except Exception as one:  # noqa: BLE001 - the event's own outcome
                outcomes.append(one)
        return outcomes

    async def _run_batch(self, events: list[tuple[Envelope, EventData]]) -> list[Exception | None]:
        handler: BatchHandler = self.handler  # type: ignore[assignment]  # batch mode
        outcomes = await handler(events)
        if outcomes is None:
            return [None] * len(events)
        if len(outcomes) != len(events):
            raise RuntimeError(f"batch handler returned {len(outcomes)} outcomes for {len(events)} events")
        return list(outcomes)

    # ------------------------------------------------------------------ settling

    async def _settle_dead(self, msg: Msg, stage: str, reason: str) -> None:
        try:
            await self.bus.deadletter(msg, self.name, stage, reason)
            await msg.term()
        except _NATS_TROUBLE as exc:
            # Could not record it: leave it unacked so it is delivered again.
            log.error("deadletter.failed", consumer=self.name, error=repr(exc))

    async def _retry_or_dead(self, msg: Msg, exc: Exception) -> None:
        self.bus.metrics.errors.labels(self.name).inc()
        delivered = msg.metadata.num_delivered if msg.metadata else 1
        reason = exc.reason if isinstance(exc, Retry) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PERMANENT):
            # The same event fails the same way every time: no retry can win.
            await self._settle_dead(msg, "rejected", f"can never be processed: {reason}")
            return
        if delivered >= self.spec.max_deliver:
            await self._settle_dead(msg, "exhausted", f"failed {delivered} times; last: {reason}")
            return
        delay = exc.delay_s if isinstance(exc, Retry) and exc.delay_s else self.spec.delay_before(delivered)
        log.warning("event.retry", consumer=self.name, subject=msg.subject, attempt=delivered, delay_s=delay,
                    reason=reason)
        try:
            await msg.nak(delay=delay)
        except _NATS_TROUBLE as nak_failed:  # it comes again after ack_wait anyway
            log.info("event.nak_failed", consumer=self.name, error=repr(nak_failed))

