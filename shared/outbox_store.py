"""Transactional outbox: stage an event in the same Redis transaction as the state change
that causes it, publish it afterwards, and publish again after a crash.

Event ids are fixed when staged and JetStream deduplicates on them, so a
re-publish after a crash between "published" and "removed from outbox" is stored once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from .bus import Bus
from .events import Envelope, encode


class Outbox:
    """`<prefix>:outbox`: a hash of staged events, field `<staging ns>:<event id>`."""

    def __init__(self, redis: Redis, prefix: str, barrier: Callable[[], Awaitable[None]] | None = None):
        self.redis = redis
        # Behind Sentinel: wait until the staging writes are on the replicas before publishing any of them.
        self.barrier = barrier
        self.key = f"{prefix}:outbox"
        # One flush at a time per process: two at once would publish an event twice
        # (JetStream stores it once, but plain subscribers would see both).
        self._flushing = asyncio.Lock()

    def stage(self, pipe: Pipeline, subject: str, env: Envelope) -> None:
        """Add the event to a pipeline (MULTI) the caller executes with its own writes."""
        # The field sorts in staging order, so events go out in the order they were caused. A wall-clock
        # read on purpose: an ordering token shared by replicas, not a time anything is decided by.
        field = f"{time.time_ns():020d}:{env.id}"
        pipe.hset(self.key, field, json.dumps({"subject": subject, "event": encode(env).decode()}))

    async def flush(self, bus: Bus, window: int = 1) -> int:
        """Publish every staged event in staging order; return how many were published.

        `window` > 1: that many publishes at once, sent in staging order (JetStream stores them
        in the order sent) and removed together once all were acknowledged; a failure stops the
        flush after its window, so what follows waits for the next flush, as with one at a time."""
        async with self._flushing:
            entries = await self.redis.hgetall(self.key)
            fields = sorted(entries)
            if fields and self.barrier is not None:
                await self.barrier()
            for start in range(0, len(fields), window):
                chunk = fields[start:start + window]
                items = [json.loads(entries[f]) for f in chunk]
                events = [(i["subject"], Envelope.model_validate_json(i["event"])) for i in items]
                # The first on its own: a connection's first request sets up its reply subscription
                # (it waits before sending); the others, started in order, each send before they wait.
                await bus.publish_envelope(*events[0])
                results = await asyncio.gather(*(bus.publish_envelope(*e) for e in events[1:]), return_exceptions=True)
                sent = zip(chunk[1:], results, strict=True)
                done = [chunk[0]] + [f for f, r in sent if not isinstance(r, BaseException)]
                await self.redis.hdel(self.key, *done)
                failed = next((r for r in results if isinstance(r, BaseException)), None)
                if failed is not None:
                    raise failed
            return len(entries)
