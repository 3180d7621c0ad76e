"""What the scheduler's collaborators share: settings, policy, clock, log, the store, the lease, one lock.

`Progress` (job events), `Failover` (nodes), `PlacementPass` (the queue policy)
and `Replica` (the lease and rebuilds) each take a `Scheduler` and the
collaborators they read from, in their constructors (app.py wires them).
The store and the lease exist once the runtime has connected to Redis
(`connect`); before that they raise StateUnavailable.
"""

from __future__ import annotations

import asyncio

import nats.errors
from redis.exceptions import RedisError

from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.runtime import Runtime, StateUnavailable

from .leadership import Leadership, NotLeader
from .placement import ModelFacts
from .records import JobRecord
from .settings import SchedulerSettings
from .store import SchedulerStore

# Events published at once by an outbox flush (in staging order).
OUTBOX_WINDOW = 256
# What a decision meets when the store or the bus is in trouble, or another replica took over: the loop
# that made it logs it and tries again later. Anything else is a bug (the runtime logs the loop's crash).
TROUBLE = (RedisError, OSError, TimeoutError, nats.errors.Error, StateUnavailable, NotLeader)


class Scheduler:
    """One scheduler replica's shared state (see the module docstring)."""

    def __init__(self, runtime: Runtime, settings: SchedulerSettings):
        self.runtime = runtime
        self.settings = settings
        self.clock = runtime.clock
        self.log = runtime.log
        self.policy = settings.policy_config()
        self.teams = settings.team_policies()
        self.facts = {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}
        # Held by every decision that reads the store and then writes it (a pass, a job's progress, failover).
        self.lock = asyncio.Lock()
        # Set when something changed that the next pass should see.
        self.dirty = asyncio.Event()
        self._store: SchedulerStore | None = None
        self._leadership: Leadership | None = None

    def connect(self) -> None:
        """The store and the lease, on the runtime's Redis (once it is connected; once)."""
        if self._store is not None:
            return
        runtime = self.runtime
        settings = self.settings
        self._leadership = Leadership(runtime.redis, runtime.prefix, settings.instance, settings.leader_lease_s)
        self._store = SchedulerStore(runtime.redis, runtime.prefix, runtime.outbox, runtime.source, self._leadership,
                                     lambda: runtime.epoch)

    @property
    def connected(self) -> bool:
        """Whether the store and the lease exist yet (see `connect`)."""
        return self._store is not None

    @property
    def store(self) -> SchedulerStore:
        if self._store is None:
            raise StateUnavailable("the scheduler is not connected to its store yet")
        return self._store

    @property
    def leadership(self) -> Leadership:
        if self._leadership is None:
            raise StateUnavailable("the scheduler is not connected to its store yet")
        return self._leadership

    @property
    def is_leader(self) -> bool:
        return self._leadership is not None and self._leadership.is_leader

    async def get_job(self, job_id: str) -> JobRecord | None:
        return await self.store.job(job_id)

    async def publish_staged(self) -> None:
        """Send what the outbox holds. The outbox is shared by the replicas: only the leader sends it."""
        if self.is_leader:
            # A pass stages thousands of placements: publish them a window at a time, in order.
            await self.runtime.outbox.flush(self.runtime.bus, window=OUTBOX_WINDOW)

    @property
    def deciding(self) -> bool:
        """Whether the store is reachable and whole (nothing is decided while it is down or being rebuilt)."""
        return self.runtime.state_ready.is_set()
