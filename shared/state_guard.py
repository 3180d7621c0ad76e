"""Whether a service's state store is reachable and whole, and its rebuild from JetStream when it is not.

The state-epoch marker (`state_store.EpochStore`) names the state a process works
on. No marker (first start, wiped, replaced): one replica claims the rebuild, runs
it, and sets a new marker; the others wait for it. A marker that changes under a
running process means the state was lost: it stops deciding (consumers pause, the
API answers 503) and rebuilds the same way.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import structlog
from redis.exceptions import RedisError

from .errors import StateUnavailable
from .state_store import EpochStore, is_rebuilding

# How often a running service checks that its state is still there, and how long a rebuilding
# replica's claim lasts if it dies mid-rebuild.
STATE_CHECK_S = 0.5
STATE_CHECK_TIMEOUT_S = 2.0
REBUILD_CLAIM_MS = 300_000


class StateGuard:
    """`ready` is set while the store is reachable and whole; `problem` says why not."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger, rebuild: Callable[[], Awaitable[None]]) -> None:
        self.log = log
        self.rebuild = rebuild
        self.ready = asyncio.Event()
        self.problem: str | None = "starting"
        self.epoch: str | None = None
        self.epochs: EpochStore | None = None

    def require(self) -> None:
        """Raise StateUnavailable unless the state store is reachable and whole."""
        if not self.ready.is_set():
            raise StateUnavailable(self.problem or "state store not ready")

    def down(self, problem: str) -> None:
        """Stop deciding: consumers pause, the API answers 503 with `problem`."""
        if self.ready.is_set():
            self.log.error("state.unavailable", problem=problem,
                           note="consumers paused; nothing decided until it is back")
        self.problem = problem
        self.ready.clear()

    def up(self) -> None:
        if not self.ready.is_set():
            self.log.warning("state.ready", after=self.problem)
        self.problem = None
        self.ready.set()

    def _epochs(self) -> EpochStore:
        if self.epochs is None:
            raise StateUnavailable("not connected to the state store yet")
        return self.epochs

    async def ensure(self) -> None:
        """Rebuild when the store holds none of this service's state; while another replica rebuilds
        (its claim has a TTL in case it dies), wait for it."""
        epochs = self._epochs()
        while True:
            current = await epochs.current()
            if current is not None and not is_rebuilding(current):
                self.epoch = current
                self.up()
                return
            if current is None:
                mine = uuid.uuid4().hex
                if await epochs.claim_rebuild(mine, REBUILD_CLAIM_MS):
                    self.log.warning("state.rebuilding", reason=self.problem)
                    started = time.perf_counter()
                    await self.rebuild()
                    await epochs.mark_rebuilt(mine)
                    self.log.warning("state.rebuilt", seconds=round(time.perf_counter() - started, 2))
                    continue
            await asyncio.sleep(0.2)

    async def watch(self) -> None:
        """Notice a lost or unreachable store while running, not only at start-up."""
        epochs = self._epochs()
        while True:
            await asyncio.sleep(STATE_CHECK_S)
            try:
                async with asyncio.timeout(STATE_CHECK_TIMEOUT_S):  # not wait_for: it can swallow a stop (3.11)
                    current = await epochs.current()
            except (RedisError, OSError, TimeoutError) as exc:
                self.down(f"state store unreachable ({type(exc).__name__})")
                continue
            if current == self.epoch:
                self.up()
                continue
            self.down("state lost (the store was wiped or replaced); rebuilding from JetStream")
            try:
                await self.ensure()
            except (RedisError, OSError) as exc:
                self.log.warning("state.rebuild_interrupted", error=repr(exc))
