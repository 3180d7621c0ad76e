"""Inventory on its store: the event handlers, lease checks, and the queries the API answers.

The decisions are the pure modules' (discovery, allocations, reconcile,
leases, rollups, findings); this module reads their inputs from the store
and writes their outcomes back.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal

import httpx
from pydantic import ValidationError

from whaleflux.shared import subjects
from whaleflux.shared.contracts import fold_holders, gpus_involved
from whaleflux.shared.contracts.billing import PriceBookView
from whaleflux.shared.contracts.holders import JOB_EVENTS as HOLDER_EVENTS
from whaleflux.shared.events import (
    Envelope,
    EventData,
    GpuCordoned,
    GpuTelemetry,
    GpuUncordoned,
    GpuValidated,
    LeaseExpired,
    NodeDrainRequested,
    NodeHeartbeat,
    NodeRegistered,
    NodeUndrained,
)
from whaleflux.shared.runtime import Runtime

from . import findings as fnd
from .allocations import allocated_at, job_change
from .assets import Declarations
from .discovery import GpuRow, discovered, gpu_rows, seen
from .leases import Lease, Notice, due_notices, leases, notice_event
from .reconcile import Reconciliation, reconcile
from .rollups import HOUR, HourRow, hour_floor, last_active, rollup, sample_sums
from .settings import InventorySettings
from .store import InventoryStore
from .valuation import revalue


class Inventory:
    def __init__(self, runtime: Runtime, settings: InventorySettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.clock = runtime.clock
        self.log = runtime.log
        self.store = InventoryStore(runtime, runtime.clock, runtime.log)
        self.prices: PriceBookView | None = None  # billing's price book, last good fetch (valuation.py)

    # ------------------------------------------------------------------ events

    async def on_node_event(self, env: Envelope, data: EventData) -> None:
        if not isinstance(data, (NodeRegistered, NodeHeartbeat)):
            return  # the consumer's subjects carry only these
        record = seen(await self.store.node(data.cluster, data.node), env.time, data)
        if record is not None:
            await self.store.save_node(record)

    async def on_job_event(self, env: Envelope, data: EventData) -> None:
        if isinstance(data, HOLDER_EVENTS):
            holds = await self.store.job_holds(data.job_id)
            current = await self.store.holders_of(gpus_involved(holds, data))
            held = fold_holders(holds, data, env.time, current)
            await self.store.save_holds(data.job_id, held)
        change = job_change(env, data)
        if change.queued is not None:
            await self.store.queue(change.queued)
        if change.dequeued is not None:
            await self.store.dequeue(change.dequeued)
        if change.opened is not None:
            await self.store.open_allocation(change.opened)
        if change.closed is not None:
            await self.store.close_allocation(*change.closed)

    async def on_validated(self, env: Envelope, data: EventData) -> None:
        """A node's burn-in: each GPU's verdict and reasons (a failed GPU is a `quarantined` finding)."""
        if not isinstance(data, GpuValidated):
            return
        for card in data.gpus:
            await self.store.save_validation(fnd.Validation(card.uuid, data.cluster, data.node, card.index,
                                                            card.verdict, data.finished_at, tuple(card.reasons)))

    async def on_cordon(self, env: Envelope, data: EventData) -> None:
        """The scheduler keeps a GPU out (gpu.cordoned: counted missing or unhealthy), or lets it back in."""
        if isinstance(data, GpuCordoned):
            await self.store.set_cordon(data.gpu_uuid, data.cause)
        elif isinstance(data, GpuUncordoned):
            await self.store.set_cordon(data.gpu_uuid, None)

    async def on_drain(self, env: Envelope, data: EventData) -> None:
        """A node drains (node.drain_requested: its GPUs count as draining, not free), or takes work again."""
        if isinstance(data, NodeDrainRequested):
            await self.store.set_drain(data.cluster, data.node, data.reason or "drained")
        elif isinstance(data, NodeUndrained):
            await self.store.set_drain(data.cluster, data.node, None)

    async def kept_out(self) -> tuple[set[str], set[str]]:
        """What the scheduler keeps out of placement, as `gpus list` counts it: the uuids it quarantines (any
        gpu.cordoned cause, `missing` too) and the "cluster/node"s that drain."""
        return set(await self.store.cordons()), set(await self.store.drains())

    async def on_telemetry(self, env: Envelope, data: EventData) -> None:
        if not isinstance(data, GpuTelemetry) or not data.gpus:
            return
        uuids = [g.uuid for g in data.gpus]
        allocated = allocated_at(await self.store.holders_of(uuids), uuids, data.sample_time)
        sums = sample_sums([(g.uuid, g.utilization_gpu_pct) for g in data.gpus], allocated)
        await self.store.add_utilization(f"{data.cluster}/{data.node}", data.sample_time, sums,
                                         int(self.settings.retention_days * 86400))

    # ------------------------------------------------------------------ queries

    def _missing_after(self) -> timedelta:
        return timedelta(seconds=self.settings.missing_after_s)

    async def gpus(self, now: datetime) -> list[GpuRow]:
        return gpu_rows(await self.store.nodes(), now, self._missing_after(), await self.store.cordons())

    async def declarations(self) -> Declarations:
        """The declarations in force (empty until a good file or upload arrives)."""
        decl = await self.store.declared.current()
        return Declarations() if decl is None else decl

    async def reconciliation(self, now: datetime, decl: Declarations | None = None) -> Reconciliation:
        decl = decl if decl is not None else await self.declarations()
        found = discovered(await self.store.nodes(), now, self._missing_after(), await self.store.cordons())
        return reconcile(decl, found, now)

    async def leases(self, now: datetime) -> list[Lease]:
        decl = await self.declarations()
        return leases(decl, (await self.reconciliation(now, decl)).assets, now)

    async def rollups(self, by: Literal["gpu", "pool"], start: datetime, end: datetime, now: datetime,
                      rec: Reconciliation | None = None) -> list[HourRow]:
        rec = rec or await self.reconciliation(now)
        groups = {a.uuid: (a.uuid if by == "gpu" else a.pool) for a in rec.assets}
        util = await self.store.utilization(start, min(end, now))
        return rollup(groups, await self.store.allocations(), util, start, end, now)

    async def holders(self) -> dict[str, str]:
        """GPU uuid -> the job holding it now."""
        return {u: h.job_id for u, h in (await self.store.holders()).items()}

    async def verdicts(self) -> dict[str, str]:
        """GPU uuid -> the verdict of its last burn-in (gpu.validated)."""
        return {v.uuid: v.verdict for v in await self.store.validations()}

    async def all_findings(self, now: datetime) -> list[fnd.Finding]:
        s = self.settings
        rec = await self.reconciliation(now)
        rec = replace(rec, assets=revalue(rec.assets, self.prices, now))  # owned GPUs as billing charges them
        by_uuid = {a.uuid: a for a in rec.assets}
        this_hour = hour_floor(now)
        gpu_rows_ = await self.rollups("gpu", this_hour - HOUR, this_hour, now, rec)
        pool_rows = await self.rollups("pool", this_hour - timedelta(days=s.consolidation_days), this_hour, now, rec)
        holders = await self.holders()
        out = fnd.idle_allocated(gpu_rows_, by_uuid, holders, s.idle_threshold_pct)
        active = last_active(await self.store.allocations(), now)
        out += fnd.reserved_idle(rec.assets, active, now, s.reserved_idle_hours)
        out += fnd.consolidation(pool_rows, rec.assets, s.consolidation_threshold, s.consolidation_days)
        _, draining = await self.kept_out()
        out.append(fnd.capacity_finding(fnd.capacity(rec.assets, set(holders), draining), await self.store.queued()))
        out += fnd.reconciliation_findings(rec, by_uuid)
        out += fnd.quarantined(await self.store.validations(), now)
        return out

    # ------------------------------------------------------------------ declarations and lease notices

    async def apply_declarations(self, text: str, source: str) -> Declarations:
        """Check and store new declarations; on AssetsError the previous ones stay in force."""
        return await self.store.declared.apply(text, source)

    async def reload_file(self) -> bool:
        """Apply the assets file if its content changed since it was last applied; True if applied."""
        return await self.store.declared.reload_file(self.settings.assets_file)

    async def check_leases(self) -> list[Notice]:
        """Publish the lease notices due now, each once; return them."""
        now = self.clock()
        current = await self.leases(now)
        publish: list[Notice] = []

        def decide(fired: set[str]) -> tuple[list[str], list[tuple[str, Envelope]]]:
            due, done = due_notices(current, tuple(self.settings.lease_horizons_days), now, fired)
            publish[:] = due
            return done, [self._notice_envelope(n, now) for n in due]

        if not await self.store.stage_notices(decide):
            return []
        await self.runtime.publish_staged()
        for notice in publish:
            self.log.info("lease.notice", contract=notice.lease.contract.id, kind=notice.kind,
                          deadline=notice.deadline, horizon_days=notice.horizon_days)
        return publish

    def _notice_envelope(self, notice: Notice, now: datetime) -> tuple[str, Envelope]:
        data = notice_event(notice, now)
        subject = subjects.LEASE_EXPIRED if isinstance(data, LeaseExpired) else subjects.LEASE_EXPIRING
        contract = notice.lease.contract.id
        env = self.runtime.envelope(data, subject=contract, event_id=notice.event_id,
                                    correlation_id=f"lease-{contract}")
        return subject, env

    # ------------------------------------------------------------------ start-up and loops

    async def on_ready(self) -> None:
        await self.runtime.publish_staged()  # notices staged before a crash go out now
        await self.reload_file()

    async def refresh_prices(self) -> bool:
        """Billing's price book (`GET /v1/pricebook`), to value owned GPUs as billing charges them; on failure
        the last good copy stays (None: findings say the amortization stands alone)."""
        if not self.settings.billing_url:
            return False
        url = self.settings.billing_url.rstrip("/") + "/v1/pricebook"
        try:
            async with httpx.AsyncClient() as http:
                resp = await http.get(url, timeout=5.0, headers=self.settings.client_headers())
                resp.raise_for_status()
            self.prices = PriceBookView.model_validate_json(resp.content)
        except (httpx.HTTPError, ValidationError) as exc:
            self.log.warning("inventory.prices_unavailable", url=url, error=repr(exc)[:200])
            return False
        return True

    async def check_loop(self) -> None:
        """The assets file, lease notices, billing's prices and allocation pruning, every `check_interval_s`."""
        while True:
            await self.refresh_prices()
            await self.reload_file()
            await self.check_leases()
            await self.store.prune_allocations(self.clock() - timedelta(days=self.settings.retention_days))
            await asyncio.sleep(self.settings.check_interval_s)
