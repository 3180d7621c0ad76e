"""Transactional outbox: stage an event in the same Redis transaction as the state change
that causes it, publish it afterwards, and publish again after a crash.

Event ids are fixed when staged and JetStream deduplicates on them, so a
re-publish after a crash between "published" and "removed from outbox" is stored once.
"""

from __future__ import annotations

import asyncio
import json
import time

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from .bus import Bus
from .events import Envelope, encode


class Outbox:
    def __init__(self, redis: Redis, prefix: str):
        self.redis = redis
        self.key = f"{prefix}:outbox"
        # One flush at a time per process: two at once would publish an event twice
        # (JetStream stores it once, but plain subscribers would see both).
        self._flushing = asyncio.Lock()

    def stage(self, pipe: Pipeline, subject: str, env: Envelope) -> None:
        """Add the event to a pipeline (MULTI) the caller executes with its own writes."""
        # The field sorts in staging order, so events go out in the order they were caused.
        field = f"{time.time_ns():020d}:{env.id}"
        pipe.hset(self.key, field, json.dumps({"subject": subject, "event": encode(env).decode()}))

    async def flush(self, bus: Bus) -> int:
        """Publish every staged event in staging order; return how many were published."""
        async with self._flushing:
            entries = await self.redis.hgetall(self.key)
            for field in sorted(entries):
                item = json.loads(entries[field])
                await bus.publish_envelope(item["subject"], Envelope.model_validate_json(item["event"]))
                await self.redis.hdel(self.key, field)
            return len(entries)
