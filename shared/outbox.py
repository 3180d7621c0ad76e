"""Transactional outbox: stage an event in the same Redis transaction as the state change
that causes it, publish it afterwards, and publish again after a crash.

Event ids are fixed when staged and JetStream deduplicates on them, so a
re-publish after a crash between "published" and "removed from outbox" is stored once.
"""

from __future__ import annotations

import json

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from .bus import Bus
from .events import Envelope, encode


class Outbox:
    def __init__(self, redis: Redis, prefix: str):
        self.redis = redis
        self.key = f"{prefix}:outbox"

    def stage(self, pipe: Pipeline, subject: str, env: Envelope) -> None:
        """Add the event to a pipeline (MULTI) the caller executes with its own writes."""
        pipe.hset(self.key, env.id, json.dumps({"subject": subject, "event": encode(env).decode()}))

    async def flush(self, bus: Bus) -> int:
        """Publish every staged event; return how many were published."""
        entries = await self.redis.hgetall(self.key)
        for event_id, raw in entries.items():
            item = json.loads(raw)
            await bus.publish_envelope(item["subject"], Envelope.model_validate_json(item["event"]))
            await self.redis.hdel(self.key, event_id)
        return len(entries)
