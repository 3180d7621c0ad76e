"""The shell that makes a replica of a scaled-out service run its share of the units (see `partitions.py`).

Every `tick` (a third of the lease): renew this replica's membership, compute the assignment over the live
members, and for each unit:
- assigned here: take or renew its lease; start it once held (if another replica still holds it, wait:
  that one stops it and gives it up, or its lease runs out when it died);
- held here but assigned elsewhere, or its lease lost: stop it (the fetch in hand is handled and acked
  first), then give the lease up.
So a unit runs in at most one replica while leases are kept, and a replica that dies hands its units over
within about two leases (its membership and leases expire). Events it had fetched but not acked come again
after the consumer's ack_wait; handlers are idempotent (or deduplicated) for that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from redis.exceptions import RedisError

from .partition_store import PartitionStore
from .partitions import MAIN, PARTITIONS, assign, partition_unit, units
from .settings import CommonSettings
from .streams import ConsumerSpec

# A replica stays a member this many leases after its last tick: one slow tick on a loaded machine must not
# reassign everything (a dead replica's units are reassigned once its membership ran out).
MEMBER_LEASES = 2


@dataclass
class Unit:
    """What running one unit means: `start` it (consumers, loops) and `stop` it (gracefully)."""

    start: Callable[[], None]
    stop: Callable[[], Awaitable[None]]


class Ownership:
    def __init__(self, store: PartitionStore, settings: CommonSettings, units: Mapping[str, Unit],
                 log: structlog.typing.FilteringBoundLogger,
                 on_gained: Callable[[], Awaitable[None]] | None = None) -> None:
        self.store = store
        self.instance = settings.instance
        self.units = dict(units)
        self.log = log
        self.lease_ms = int(settings.partition_lease_s * 1000)
        self.on_gained = on_gained  # before a gained partition starts: reload what is kept in memory
        self.running: set[str] = set()
        self.members: list[str] = []
        self.assignment: dict[str, str] = {}
        self.live = False  # the last tick reached the store
        self._ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except (RedisError, OSError) as exc:
                # Leases cannot be renewed: stop everything before they run out, so no other replica and
                # this one run a unit at once.
                self.live = False
                self.log.warning("ownership.store_unreachable", error=repr(exc))
                await self.stop_all()
            await asyncio.sleep(self.lease_ms / 3000)

    async def tick(self) -> None:
        self.members = await self.store.heartbeat(self.instance, self.lease_ms * MEMBER_LEASES)
        self.assignment = assign(list(self.units), self.members)
        self.live = True
        mine = [unit for unit in self.units if self.assignment.get(unit) == self.instance]
        # Every lease renewed (or taken) first, all at once: a tick that stops units must not delay renewals.
        holders = dict(zip(mine, await asyncio.gather(*(self.store.claim(unit, self.instance, self.lease_ms)
                                                          for unit in mine)), strict=True))
        lost = [unit for unit, holder in holders.items() if holder != self.instance and unit in self.running]
        moved = [unit for unit in self.running if unit not in holders]
        for unit in lost:
            self.log.warning("ownership.lease_lost", unit=unit, holder=holders[unit])
        # Stopped together: each stop waits for its consumers' fetch in hand.
        await asyncio.gather(*(self._stop(unit) for unit in [*lost, *moved]))
        await asyncio.gather(*(self.store.release(unit, self.instance) for unit in moved))
        gained = [unit for unit, holder in holders.items() if holder == self.instance and unit not in self.running]
        if gained and self._ticks and self.on_gained is not None and any(u != MAIN for u in gained):
            await self.on_gained()
        for unit in gained:
            self.units[unit].start()
            self.running.add(unit)
        if gained:
            self.log.info("ownership.gained", units=gained, members=len(self.members),
                          running=sorted(self.running))
        self._ticks += 1

    async def _stop(self, unit: str) -> None:
        self.running.discard(unit)
        await self.units[unit].stop()
        self.log.info("ownership.handed_over", unit=unit)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(unit) for unit in sorted(self.running)))

    def begin(self, guard: Callable[[Callable[[], Awaitable[None]]], Coroutine[Any, Any, None]]) -> Ownership:
        """Run `run` as a task, under the runtime's `guard` (a loop that raised is restarted)."""
        self._task = asyncio.create_task(guard(self.run), name="ownership")
        return self

    async def leave(self) -> None:
        """Stopping: the tick loop ended, every unit stopped, then out of the members with every lease given up
        at once, so the other replicas take over now."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.stop_all()
        try:
            await self.store.leave(self.instance, list(self.units))
        except (RedisError, OSError) as exc:  # the leases run out by themselves
            self.log.warning("ownership.leave_failed", error=repr(exc))


def plan(specs: Mapping[str, ConsumerSpec]) -> dict[str, list[tuple[str, ConsumerSpec]]]:
    """unit -> the (declared name, durable consumer) pairs it runs: each partitioned consumer's partition k in
    unit `p<k>`, every other consumer in `main`."""
    out: dict[str, list[tuple[str, ConsumerSpec]]] = {unit: [] for unit in units()}
    for name, spec in specs.items():
        if spec.partitioned:
            for k in range(PARTITIONS):
                out[partition_unit(k)].append((name, spec.partition(k)))
        else:
            out[MAIN].append((name, spec))
    return out


def service_units(specs: Mapping[str, ConsumerSpec], start_consumer: Callable[[str, ConsumerSpec], None],
                  stop_consumer: Callable[[str], Awaitable[None]],
                  loops: Sequence[Callable[[], Coroutine[Any, Any, None]]]) -> dict[str, Unit]:
    """The units of a service with these consumers and background `loops` (which run with `main`)."""
    tasks: list[asyncio.Task[None]] = []

    def starter(pairs: list[tuple[str, ConsumerSpec]], with_loops: bool) -> Callable[[], None]:
        def start() -> None:
            for name, spec in pairs:
                start_consumer(name, spec)
            if with_loops:
                tasks.extend(asyncio.create_task(loop(), name=getattr(loop, "__name__", "loop")) for loop in loops)
        return start

    def stopper(pairs: list[tuple[str, ConsumerSpec]], with_loops: bool) -> Callable[[], Awaitable[None]]:
        async def stop() -> None:
            if with_loops:
                running = list(tasks)
                tasks.clear()
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
            for _, spec in pairs:
                await stop_consumer(spec.durable)
        return stop

    return {unit: Unit(starter(pairs, unit == MAIN), stopper(pairs, unit == MAIN))
            for unit, pairs in plan(specs).items()}
