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
from dataclasses import replace
from typing import Any

import nats
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError, ServerError, ServiceUnavailableError
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay, wait_random_exponential

from . import subjects
from .clock import Clock, system_clock
from .consumer import Consumer
from .dedup_store import SEEN_TTL_S, SeenStore
from .events import Envelope, EventData, encode, make_envelope
from .handlers import BatchHandler, BusMetrics, Handler, Reject, Retry, batch_handler, is_batch_handler
from .streams import STREAMS, ConsumerSpec

__all__ = ["REASON_HEADER", "SEEN_TTL_S", "BatchHandler", "Bus", "BusMetrics", "Handler", "Reject", "Retry",
           "batch_handler", "is_batch_handler"]

log = structlog.get_logger("whaleflux.bus")
REASON_HEADER = "WhaleFlux-Reason"
# JetStream could not create a consumer now, but may in a moment: no answer in time (NATS away, reconnecting,
# or too busy: a thousand nodes' consumers created at once), JetStream not ready, the stream not there yet.
TRANSIENT_JS_ERRORS = (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                       nats.errors.ConnectionReconnectingError, ServiceUnavailableError, ServerError, NotFoundError)
CONSUMER_PATIENCE_S = 300.0  # how long `ensure_consumer_patiently` keeps trying by default


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS_URL: one URL, or a cluster's URLs comma-separated (a client tries each, and
    reconnects to another when its server goes away)."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("NATS_URL names no server")
    return servers


def _header_safe(text: str, limit: int = 1000) -> str:
    return " ".join(text.split())[:limit]


class ConsumerNeedsReplacing(RuntimeError):
    """A consumer whose owner may not delete it (a node's) has a config the server will not change in place."""

    def __init__(self, spec: ConsumerSpec, reason: str) -> None:
        super().__init__(
            f"consumer {spec.durable} of {spec.stream} must be replaced ({reason}) and its identity may not delete "
            f"it: an operator deletes it with an identity allowed to (`nats consumer rm {spec.stream} "
            f"{spec.durable}`), and it is created again at the next start")
        self.spec = spec


class Bus:
    """One NATS connection with JetStream, used by one process; envelopes it makes are timed by `clock`."""

    def __init__(self, nc: nats.NATS, source: str, metrics: BusMetrics | None = None, clock: Clock = system_clock,
                 replicas: int = 1):
        self.nc = nc
        self.replicas = replicas  # copies of each stream and bucket this process declares
        self.js = nc.jetstream()
        self.source = source
        self.clock = clock
        self.metrics = metrics or BusMetrics.create(CollectorRegistry())
        self.bound: set[str] = set()
        self._consumers: dict[str, tuple[Consumer, asyncio.Task[None]]] = {}
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
        connect_timeout: int = 5,
        reconnect: bool = True,
        clock: Clock = system_clock,
        replicas: int = 1,
    ) -> Bus:
        """Connect to `url` (one server or several, comma-separated); services reconnect forever (to any server
        of the cluster), a one-shot client (`reconnect=False`) fails fast. `replicas`: see `ensure_streams`."""
        bus = cls(nats.NATS(), source, metrics, clock, replicas)
        await bus.nc.connect(
            nats_servers(url),
            user=user,
            password=password,
            name=source,
            # Replies under `_INBOX.<user>`: the only inbox its NATS permissions let it read (shared/permissions.py).
            inbox_prefix=subjects.inbox_prefix(user) if user else "_INBOX",
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
        return bool(self.nc.is_connected)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def ensure_streams(self) -> None:
        """Create or update every declared stream (idempotent), each with `self.replicas` copies."""
        for spec in STREAMS.values():
            config = spec.config(self.replicas)
            try:
                await self.js.add_stream(config)
            except BadRequestError:
                await self.js.update_stream(config)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create the durable consumer if missing. One that exists keeps its position: when its filters or
        delivery limits changed (an upgrade), it is updated in place (nats-server 2.10 and later), so it
        does not deliver its stream's history again; only a server that refuses the update has it replaced."""
        try:
            info = await self.js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            info = None
        if info is not None:
            have, want = info.config, spec.config()
            if (sorted(have.filter_subjects or [have.filter_subject]) == sorted(spec.filter_subjects)
                    and have.max_deliver == want.max_deliver and have.max_ack_pending == want.max_ack_pending):
                return
            # Its own config with only these changed: where it delivers from (a repositioned start) stays.
            update = replace(have, filter_subject=want.filter_subject, filter_subjects=want.filter_subjects,
                             max_deliver=want.max_deliver, max_ack_pending=want.max_ack_pending)
            try:
                await self.js.add_consumer(spec.stream, update)
                log.info("bus.consumer_updated", consumer=spec.durable, filters=spec.filter_subjects)
                return
            except BadRequestError as exc:
                if not spec.replaceable:
                    raise ConsumerNeedsReplacing(spec, exc.description or str(exc)) from exc
                log.warning("bus.consumer_replaced", consumer=spec.durable, reason=exc.description)
            await self.js.delete_consumer(spec.stream, spec.durable)
        try:
            await self.js.add_consumer(spec.stream, spec.config())
        except BadRequestError:
            # Created meanwhile by another replica of the same service: use it.
            await self.js.consumer_info(spec.stream, spec.durable)

    async def ensure_consumer_patiently(self, spec: ConsumerSpec, give_up_after_s: float = CONSUMER_PATIENCE_S,
                                        max_wait_s: float = 10.0) -> None:
        """`ensure_consumer`, tried again while JetStream cannot create it yet (`TRANSIENT_JS_ERRORS`), with a
        random exponential back-off (0.5 s up to `max_wait_s`: a thousand nodes do not retry in step) for at most
        `give_up_after_s`; the streams are declared again before each retry. Each failure is logged; the last one
        is raised when time is up. Any other error (a bad request, a closed connection) is raised at once."""

        def waiting(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("bus.consumer_waiting", consumer=spec.durable, stream=spec.stream, error=repr(error),
                        attempt=state.attempt_number, retry_in_s=round(state.upcoming_sleep, 2))

        async for attempt in AsyncRetrying(retry=retry_if_exception_type(TRANSIENT_JS_ERRORS),
                                           wait=wait_random_exponential(multiplier=0.5, max=max_wait_s),
                                           stop=stop_after_delay(give_up_after_s), before_sleep=waiting,
                                           reraise=True):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    await self.ensure_streams()  # a stream lost with a server's store comes back
                await self.ensure_consumer(spec)
                if attempt.retry_state.attempt_number > 1:
                    log.info("bus.consumer_created", consumer=spec.durable, attempts=attempt.retry_state.attempt_number)

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

    def envelope(self, data: EventData, *, subject: str | None = None, **kw: Any) -> Envelope:
        """A new envelope from this process (`kw`: event_id, correlation_id, time), timed by the bus's clock."""
        kw.setdefault("time", self.clock())
        return make_envelope(data, source=self.source, subject=subject, **kw)

    async def publish(self, nats_subject: str, data: EventData, **kw: Any) -> Envelope:
        """Publish `data` in a new envelope; `kw` sets envelope attributes (subject, event_id, ...)."""
        env = self.envelope(data, **kw)
        await self.publish_envelope(nats_subject, env)
        return env

    async def publish_envelope(self, subject: str, env: Envelope) -> None:
        # Nats-Msg-Id makes a re-publish of the same event (outbox replay) a no-op.
        await self.js.publish(subject, encode(env), headers={"Nats-Msg-Id": env.id})

    async def deadletter(self, msg: Msg, consumer: str, stage: str, reason: str) -> None:
        seq = msg.metadata.sequence.stream if msg.metadata else None
        stream = STREAMS.get(msg.metadata.stream) if msg.metadata else None
        # As published: a partitioned stream stores it with its partition appended.
        subject = stream.published(msg.subject) if stream is not None else msg.subject
        headers = {
            # One dead letter per original message, even if recording it is retried.
            **({"Nats-Msg-Id": f"dl-{consumer}-{seq}"} if seq is not None else {}),
            REASON_HEADER: _header_safe(reason),
            "WhaleFlux-Consumer": consumer,
            "WhaleFlux-Stage": stage,
            "WhaleFlux-Subject": subject,
        }
        await self.js.publish(subjects.deadletter(subject), msg.data, headers=headers)
        self.metrics.deadlettered.labels(consumer, stage).inc()
        log.warning("event.deadlettered", consumer=consumer, subject=subject, stage=stage, reason=reason)

    # ------------------------------------------------------------------ consume

    def start_consumer(self, spec: ConsumerSpec, handler: Handler | BatchHandler, redis: Redis | None,
                       seen_prefix: str, gate: asyncio.Event | None = None) -> None:
        """Run a durable consumer; a handler marked `@batch_handler` gets each fetch's valid events at once.

        `redis`: where handled event ids are remembered (`seen_prefix`), for consumers with `dedup`.
        `gate`: fetch only while it is set (a service whose state store is down or being rebuilt
        takes no events meanwhile, so none is spent on retries it cannot win)."""
        if is_batch_handler(handler) and spec.dedup:
            # Batch mode has no per-event id dedup: only for handlers idempotent by nature.
            raise ValueError(f"consumer {spec.durable}: a batch handler needs dedup=False")
        if spec.durable in self._consumers:
            raise ValueError(f"consumer {spec.durable} is running already")
        seen = SeenStore(redis, seen_prefix, spec.durable) if redis is not None else None
        consumer = Consumer(self, spec, handler, seen, gate)
        self._consumers[spec.durable] = (consumer, asyncio.create_task(consumer.run(), name=spec.durable))

    async def stop_consumer(self, durable: str) -> None:
        """End one consumer's loop once the fetch in hand is handled and acked (a partition handed over)."""
        consumer, task = self._consumers.pop(durable)
        consumer.stop()
        await asyncio.gather(task, return_exceptions=True)

    def running_consumers(self) -> dict[str, ConsumerSpec]:
        """durable -> declaration of every consumer whose loop this process runs."""
        return {name: consumer.spec for name, (consumer, _) in self._consumers.items()}

    def ended_consumers(self) -> list[str]:
        """Consumers whose delivery loop has ended (none should, before `close`: the loop never dies)."""
        return [name for name, (_, task) in self._consumers.items() if task.done()]

    async def close(self, timeout_s: float = 2.0) -> None:
        """Consumers cancelled (each given `timeout_s` to end; one that does not is named and left), then the
        connection flushed and closed."""
        self._stopping.set()
        tasks = [task for _, task in self._consumers.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
            for task in stuck:  # a hang at shutdown must say where it is
                log.error("bus.consumer_would_not_stop", consumer=task.get_name(), timeout_s=timeout_s,
                          stack=[f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack()])
        self._consumers.clear()
        if not self.nc.is_closed:
            # Consumers are stopped and every ack was sent; drain() would wait out
            # its timeout on the pull subscriptions, so flush and close instead.
            try:
                await self.nc.flush(timeout=2)
            except (nats.errors.Error, TimeoutError) as exc:
                log.info("nats.flush_failed", error=repr(exc))
            await self.nc.close()
