"""Leader election between scheduler replicas: a Redis lease with a fencing token.

One replica holds the lease key (`SET NX PX`, renewed well before it expires);
each acquisition takes the next value of a counter that never goes back
(`INCR`), the fencing token. The holder writes its state only in transactions
that WATCH that counter and check it still equals its own token
(`SchedulerStore.transaction`), so a replica that paused past its lease and
woke up after another took over cannot commit anything: its EXEC fails.
Renewals touch only the lease key, never the counter, so they do not disturb
the holder's own transactions. The keys and scripts: `lease_store.py`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from .lease_store import LeaseStore


class NotLeader(Exception):
    """A state change was attempted without holding the current fencing token."""


class Leadership:
    def __init__(self, redis: Redis, prefix: str, instance: str, lease_s: float):
        self.lease = LeaseStore(redis, prefix)
        self.lease_key, self.token_key = self.lease.lease_key, self.lease.token_key
        # Two replicas started with the same instance name must still tell themselves apart.
        self.holder = f"{instance}:{secrets.token_hex(4)}"
        self.lease_ms = max(int(lease_s * 1000), 100)
        self.token: int | None = None

    @property
    def is_leader(self) -> bool:
        return self.token is not None

    @property
    def _value(self) -> str:
        return f"{self.holder} {self.token}"

    async def try_acquire(self) -> bool:
        """Take the lease if it is free (back with the same token if ours lapsed and nobody took one since)."""
        token = await self.lease.take(self.holder, self.lease_ms, self.token)
        if token:
            self.token = token
        return bool(token)

    async def acquire(self, poll_s: float) -> int:
        """Wait until this replica holds the lease; returns its fencing token."""
        while True:
            token = await self.lease.take(self.holder, self.lease_ms)
            if token:
                self.token = token
                return token
            await asyncio.sleep(poll_s)

    async def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours (expired, or taken over)."""
        if self.token is None:
            return False
        return await self.lease.extend(self._value, self.lease_ms)

    async def current(self) -> tuple[str | None, int | None]:
        """(holder, token) of whoever holds the lease now, or (None, None)."""
        return await self.lease.holder()

    async def release(self) -> None:
        """Give the lease up at a clean stop, so the standby takes over at once instead of after the TTL."""
        if self.token is not None:
            await self.lease.give_up(self._value)
            self.token = None

    async def keep(self, on_lost: Callable[[], Awaitable[None]]) -> None:
        """Renew every third of the lease. If it lapsed but nobody took it, take it again (with the
        same token when no other replica took one meanwhile, else a new one: transactions under the
        old one fail, which is safe); if another replica holds it, call `on_lost` once and stop."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                if await self.renew():
                    continue
                if await self.try_acquire():
                    continue
            except (RedisError, OSError):
                continue  # Redis unreachable: keep trying; fencing stops any late write
            self.token = None
            await on_lost()
            return
