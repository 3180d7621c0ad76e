"""Writes confirmed on Redis replicas before the bus hears of them (Redis behind Sentinel).

Redis replicates asynchronously: a master killed right after a write can take it with it, and the replica
Sentinel promotes never had it. A service acknowledges an event, or publishes what its outbox staged, only
after `ReplicaBarrier` saw its writes reach `replicas` replicas, so a failover loses nothing the rest of the
system was told about: an event whose writes were lost was not acknowledged and comes again (handlers are
idempotent), and a placement whose record was lost was never published.

`WAIT` counts the writes of its own connection only, so the barrier writes a counter and waits on the same
connection: every write this process had an answer for is before it in the replication stream.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError


class NotReplicated(RedisConnectionError):
    """Fewer replicas than required confirmed the writes in time (treated like an unreachable store)."""


class ReplicaBarrier:
    """`await barrier()` returns once this process's writes so far are on `replicas` replicas."""

    def __init__(self, redis: Redis, prefix: str, replicas: int, timeout_ms: int = 2000) -> None:
        self.redis = redis
        self.key = f"{prefix}:replicated"
        self.replicas = replicas
        self.timeout_ms = timeout_ms

    async def __call__(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(self.key)
        pipe.wait(self.replicas, self.timeout_ms)
        _, confirmed = await pipe.execute()
        if int(confirmed) < self.replicas:
            raise NotReplicated(f"writes confirmed by {confirmed} replica(s) within {self.timeout_ms} ms, "
                                f"{self.replicas} required (WHALEFLUX_REDIS_MIN_REPLICAS)")
