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
import threading
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from whaleflux.shared.redis_client import StateConnection

from .lease_store import LeaseStore

# A leader whose event loop showed no sign of life for this many leases stops renewing (see `Leadership.keep`).
STALL_LEASES = 10


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
        self._alive = 0.0  # when the event loop last ticked (`keep`)

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

    async def keep(self, on_lost: Callable[[], Awaitable[None]], connect: Callable[[], StateConnection]) -> None:
        """Renew every third of the lease, on a thread of its own with its own Redis connection (`connect`), so a
        long pass or a busy event loop cannot let the lease lapse. If it lapsed but nobody took it, take it again
        (with the same token when no other replica took one meanwhile, else a new one: transactions under the
        old one fail, which is safe); if another replica holds it, call `on_lost` once and return.

        The thread renews only while this event loop shows it is alive (a tick every third of the lease): a
        loop stuck for `STALL_LEASES` leases stops renewing, so a wedged leader is replaced by a standby."""
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()
        self._alive = time.monotonic()
        stop = threading.Event()
        thread = threading.Thread(target=self._renew_on_thread, args=(connect, loop, lost, stop),
                                  name="leader-lease", daemon=True)
        thread.start()
        try:
            while not lost.done():
                self._alive = time.monotonic()
                await asyncio.wait([lost], timeout=self.lease_ms / 3000)
        finally:
            stop.set()
        self.token = None
        await on_lost()

    def _renew_on_thread(self, connect: Callable[[], StateConnection], loop: asyncio.AbstractEventLoop,
                         lost: asyncio.Future[None], stop: threading.Event) -> None:
        def say_lost() -> None:
            if not lost.done():
                lost.set_result(None)

        if asyncio.run(self._renew_until_lost(connect, stop)) and not loop.is_closed():
            loop.call_soon_threadsafe(say_lost)

    async def _renew_until_lost(self, connect: Callable[[], StateConnection], stop: threading.Event) -> bool:
        """True: another replica holds the lease now; False: asked to stop."""
        conn = connect()
        lease = LeaseStore(conn.redis, self.lease.prefix)
        period = self.lease_ms / 3000
        try:
            while True:
                await asyncio.sleep(period)
                if stop.is_set():
                    return False
                if time.monotonic() - self._alive > STALL_LEASES * self.lease_ms / 1000:
                    continue  # the event loop is stuck: let the lease lapse
                try:
                    if self.token is not None and await lease.extend(self._value, self.lease_ms):
                        continue
                    token = await lease.take(self.holder, self.lease_ms, self.token)
                except (RedisError, OSError):
                    continue  # Redis unreachable: keep trying; fencing stops any late write
                if token:
                    self.token = token
                    continue
                return True
        finally:
            await conn.aclose()
