"""The ids of events a durable consumer has handled, so a redelivered event is acked, not handled twice."""

from __future__ import annotations

from redis.asyncio import Redis

SEEN_TTL_S = 14 * 86400


class SeenStore:
    """`<prefix>:seen:<consumer>:<event id>` markers, kept two weeks (longer than any redelivery)."""

    def __init__(self, redis: Redis, prefix: str, consumer: str) -> None:
        self.redis = redis
        self.base = f"{prefix}:seen:{consumer}:"

    async def seen(self, event_id: str) -> bool:
        return bool(await self.redis.exists(self.base + event_id))

    async def mark(self, event_id: str) -> None:
        await self.redis.set(self.base + event_id, 1, ex=SEEN_TTL_S)
