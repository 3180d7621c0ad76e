"""A scheduler replica's life: a standby until it wins the lease, then the leader; rebuilds; a clean stop.

The runtime calls these as the scheduler's `ServiceParts` (app.py): `on_ready`
after it connected (wins the lease before any consumer binds or any pass runs),
`rebuild` when the store lost the scheduler's state, `publish` for the outbox,
`readiness` for /readyz and `on_stop` at shutdown.
"""

from __future__ import annotations

import asyncio
import os
import signal

from redis.exceptions import RedisError

from whaleflux.shared.redis_client import StateConnection

from .failover import Failover
from .passes import PlacementPass
from .rebuild import rebuild, snapshot
from .service import TROUBLE, Scheduler


class Replica:
    """The lease and the state's lifecycle around the scheduler's collaborators."""

    def __init__(self, scheduler: Scheduler, failover: Failover, placement: PlacementPass):
        self.s = scheduler
        self.failover = failover
        self.placement = placement
        self._keeping = False

    async def on_ready(self) -> None:
        """Connected: wait for the lease. A standby serves reads over HTTP from here on, but binds no consumer
        and runs no pass (the runtime starts those after this returns) until it holds the lease."""
        s = self.s
        s.connect()
        leadership = s.leadership
        if not leadership.is_leader:
            s.log.info("leader.waiting", holder=leadership.holder)
            token = await leadership.acquire(poll_s=s.settings.leader_lease_s / 6)
            s.log.warning("leader.elected", holder=leadership.holder, token=token)
        if not self._keeping:
            s.runtime.spawn(leadership.keep(self._lease_lost, self._lease_connection), name="leader-lease")
            self._keeping = True
        # Nodes are judged by heartbeats seen from now on, not blamed for our own downtime
        # (or for the time we were a standby).
        self.failover.watch_afresh()
        # Placements committed before a crash (ours or the previous leader's) but not yet published go out now.
        await s.publish_staged()

    async def rebuild(self) -> None:
        """Fold the job history in JetStream into a fresh state (see rebuild.py), deciding nothing meanwhile."""
        s = self.s
        async with s.lock:
            done = await rebuild(s.runtime.bus, s.store, s.settings.hold_s, s.settings.max_restarts, s.clock())
            # Nodes get a fresh chance to be heard: a gap in heartbeats while we rebuilt is ours.
            self.failover.watch_afresh()
            self.placement.forget_reasons()
        s.log.warning("state.folded", jobs=done.jobs, events=done.events, pending=done.pending, active=done.active,
                      nodes=done.nodes, last_seq=done.last_seq)
        s.dirty.set()

    def _lease_connection(self) -> StateConnection:
        """A Redis connection of the lease thread's own (the runtime's belongs to the event loop)."""
        return StateConnection(self.s.runtime.settings, self.s.runtime.prefix)

    async def _lease_lost(self) -> None:
        """Another replica leads now: our transactions fail from here on (fencing); stop cleanly,
        to be restarted as a standby by whatever supervises the process."""
        self.s.log.error("leader.lost", holder=self.s.leadership.holder,
                         note="another replica holds the lease; exiting")
        os.kill(os.getpid(), signal.SIGTERM)

    async def readiness(self, checks: dict[str, bool]) -> dict[str, bool]:
        """A standby binds no consumers and rebuilds nothing until it wins the lease; it is ready to serve reads."""
        if not self.s.is_leader:
            return {k: v for k, v in checks.items() if not k.startswith("consumer:") and k != "state"}
        return checks

    async def on_stop(self) -> None:
        """Give the lease up, so a standby takes over at once instead of after the lease's TTL."""
        if self.s.is_leader and self.s.runtime.connected:
            try:
                await self.s.leadership.release()
            except (RedisError, OSError) as exc:
                self.s.log.warning("leader.release_failed", error=repr(exc))

    async def snapshot_loop(self) -> None:
        """Fold the job history into a snapshot every `snapshot_interval_s` (a rebuild reads it and the tail)."""
        settings = self.s.settings
        while True:
            await asyncio.sleep(settings.snapshot_interval_s)
            try:
                seq, jobs = await snapshot(self.s.runtime.bus, settings.hold_s, settings.max_restarts, self.s.clock(),
                                           settings.keep_finished_days * 86400)
                self.s.log.info("history.snapshot", seq=seq, jobs=jobs)
            except TROUBLE as exc:
                # The next tick tries again; a rebuild without it reads more of the stream.
                self.s.log.warning("history.snapshot_failed", error=repr(exc))
