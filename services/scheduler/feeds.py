"""What the placement core filters on that only other services know: measured free GPU memory
(telemetry's samples, on the bus) and lease ends (inventory's HTTP API); the same samples go on to the GPU
quarantine (`GpuHealth`), which judges their health flags.

Free memory and lease ends are kept in memory only: the next sample and the next poll bring them back
after a restart (the quarantine is in the store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

import httpx
from pydantic import ValidationError
from structlog.typing import FilteringBoundLogger

from whaleflux.shared.bus import batch_handler
from whaleflux.shared.contracts import LEASES, LeaseRow
from whaleflux.shared.events import Envelope, EventData, GpuTelemetry
from whaleflux.shared.runtime import Clock

from .settings import SchedulerSettings

if TYPE_CHECKING:
    from .gpu_health import GpuHealth

# Memory the driver and CUDA context keep on a GPU beyond what a sample reports used.
DRIVER_RESERVE_MIB = 256.0
# A GPU not sampled for this long has no measured free memory (the bookkeeping alone decides).
STALE_S = 30.0


def free_memory(batch: GpuTelemetry) -> dict[str, float]:
    """Each GPU's measured free memory in a node's sample, less the driver reserve."""
    return {g.uuid: max(g.memory_total_mib - g.memory_used_mib - DRIVER_RESERVE_MIB, 0.0) for g in batch.gpus}


def idle_memory(batch: GpuTelemetry) -> dict[str, float]:
    """What each GPU of a node's sample would have free with nothing running on it: its nameplate less what no
    process holds (the driver's and the idle card's own use) and the driver reserve. A process's memory (a job's,
    a foreign one's) comes back when it ends; the rest never does. A GPU with a process whose memory the device
    did not report (0: no permission, in a container) says nothing of its idle state: it is left out."""
    out = {}
    for g in batch.gpus:
        if any(p.used_mib <= 0 for p in g.processes):
            continue
        base = max(g.memory_used_mib - sum(p.used_mib for p in g.processes), 0.0)
        out[g.uuid] = max(g.memory_total_mib - base - DRIVER_RESERVE_MIB, 0.0)
    return out


def lease_ends(leases: Iterable[LeaseRow]) -> dict[str, float]:
    """Node name -> when its lease ends (epoch s), from inventory's /v1/leases; an auto-renewing
    lease does not end, and a node under several leases ends with the first."""
    out: dict[str, float] = {}
    for lease in leases:
        if lease.auto_renew:
            continue
        end = lease.ends_at.timestamp()
        for node in lease.nodes:
            out[node] = min(end, out.get(node, end))
    return out


class Feeds:
    """Measured free memory per GPU (from telemetry on the bus) and lease ends per node (from inventory)."""

    def __init__(self, settings: SchedulerSettings, clock: Clock, log: FilteringBoundLogger,
                 health: GpuHealth | None = None):
        self.settings = settings
        self.health = health
        self.clock = clock
        self.log = log
        self._memory: dict[str, tuple[float, float]] = {}  # GPU uuid -> (free MiB, when sampled)
        # GPU uuid -> the most it was seen to offer idle (`idle_memory`): a fact of the card, kept while we run.
        self._idle: dict[str, float] = {}
        # Node name -> when its lease ends (epoch s), as inventory last said.
        self.leases: dict[str, float] = {}

    @batch_handler
    async def on_telemetry(self, events: list[tuple[Envelope, EventData]]) -> None:
        now = self.clock().timestamp()
        for _env, batch in events:
            if not isinstance(batch, GpuTelemetry):
                continue  # the telemetry consumer's subjects carry nothing else
            for uuid, free in free_memory(batch).items():
                self._memory[uuid] = (free, now)
            for uuid, idle in idle_memory(batch).items():
                self._idle[uuid] = max(idle, self._idle.get(uuid, 0.0))
            if self.health is not None:
                await self.health.observe(batch)

    def measured_free(self) -> dict[str, float]:
        """Free memory per GPU from samples no older than STALE_S."""
        now = self.clock().timestamp()
        return {uuid: free for uuid, (free, at) in self._memory.items() if now - at <= STALE_S}

    def idle_free(self) -> dict[str, float]:
        """What each GPU offers when idle (MiB), as its samples showed; a GPU never sampled is not in it."""
        return dict(self._idle)

    async def lease_loop(self) -> None:
        if not self.settings.inventory_url:
            return
        url = self.settings.inventory_url.rstrip("/") + "/v1/leases"
        async with httpx.AsyncClient(timeout=10) as http:
            while True:
                try:
                    resp = await http.get(url, headers=self.settings.client_headers())
                    resp.raise_for_status()
                    self.leases = lease_ends(LEASES.validate_json(resp.content))
                except (httpx.HTTPError, ValidationError) as exc:
                    # The last known ends stay in force; inventory may start after the scheduler.
                    self.log.warning("leases.refresh_failed", error=repr(exc))
                await asyncio.sleep(self.settings.lease_refresh_s)
