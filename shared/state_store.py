"""The shell's own Redis keys: the state-epoch marker that says whether a service's state is whole.

The marker names the state generation a process works on. A replica that finds none claims
the rebuild (`rebuilding:<id>`, with a TTL in case it dies mid-rebuild), rebuilds, then sets
the marker to its id; a marker that changes under a running process means the store was
wiped or replaced.
"""

from __future__ import annotations

from redis.asyncio import Redis

REBUILDING = "rebuilding:"


class EpochStore:
    """The `<prefix>:state-epoch` marker of one service."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis = redis
        self.key = f"{prefix}:state-epoch"

    async def current(self) -> str | None:
        """The marker: an epoch id, `rebuilding:<id>` while a replica rebuilds, or None (no state)."""
        value = await self.redis.get(self.key)
        return value if value is None or isinstance(value, str) else value.decode()

    async def claim_rebuild(self, mine: str, ttl_ms: int) -> bool:
        """Claim the rebuild when there is no marker; True if this process won it."""
        return bool(await self.redis.set(self.key, f"{REBUILDING}{mine}", nx=True, px=ttl_ms))

    async def mark_rebuilt(self, mine: str) -> None:
        await self.redis.set(self.key, mine)

    async def ping(self) -> bool:
        return bool(await self.redis.ping())


def is_rebuilding(marker: str) -> bool:
    return marker.startswith(REBUILDING)
