"""Billing's shell: moves data between the bus, the store, inventory's HTTP API and the decision modules.

Exactly once by construction: every ledger write is keyed by (job, attempt)
and follows from the events alone (ledger.py), so a redelivered or
replayed event rewrites the same values. Costs are computed when asked, from
the ledger, the price book in force and the ownership terms (costing.py), so
a replay gives identical totals.
"""

from __future__ import annotations

import asyncio
import gc
from datetime import datetime
from typing import Any

import httpx
import nats.errors
from pydantic import ValidationError
from redis.exceptions import RedisError

from whaleflux.shared import subjects
from whaleflux.shared.bus import batch_handler
from whaleflux.shared.contracts import ASSETS
from whaleflux.shared.errors import StateUnavailable
from whaleflux.shared.events import AlertRaised, Envelope, EventData, GpuTelemetry, make_envelope
from whaleflux.shared.runtime import Runtime

from . import costing, energy, ledger
from .budgets import BudgetStatus, alert_changes, evaluate, history_start
from .costing import Costed, Inputs
from .metering import merge_parts
from .pricebook import PriceBook, reference_book
from .report import job_line
from .settings import BillingSettings
from .store import BillingStore

# What a background loop's tick may meet and still try again next tick (anything else is a bug).
_TICK_TROUBLE = (RedisError, OSError, httpx.HTTPError, nats.errors.Error, StateUnavailable)


class Billing:
    """The billing service's behaviour over one runtime: event handlers, reads for the API, loops."""

    def __init__(self, runtime: Runtime, settings: BillingSettings):
        self.runtime = runtime
        self.settings = settings
        self.log = runtime.log
        self._store: BillingStore | None = None
        self._http: httpx.AsyncClient | None = None
        self._refreshing = asyncio.Lock()  # one fetch of inventory at a time: an older answer never lands last

    @property
    def store(self) -> BillingStore:
        """The store (made once connected; before that, StateUnavailable: the API answers 503)."""
        if self._store is None:
            raise StateUnavailable("billing is not connected to its store yet")
        return self._store

    def now(self) -> datetime:
        return self.runtime.clock()

    # ------------------------------------------------------------------ lifecycle

    async def on_ready(self) -> None:
        rt = self.runtime
        self._store = BillingStore(rt.redis, rt.prefix, rt.outbox, int(self.settings.energy_retention_days * 86400),
                                   rt.clock, self.log)
        if self._http is None:
            self._http = httpx.AsyncClient()
        await rt.publish_staged()
        indexed = await self._store.ensure_usage_index()
        if indexed:
            self.log.info("billing.usage_indexed", records=indexed)
        await self.reload_pricebook_file()
        # As telemetry: what is loaded by now lives as long as the process; out of the cyclic GC's
        # full collections it costs ingest nothing (about a tenth of its CPU per event otherwise).
        gc.freeze()

    async def on_stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def inventory_loop(self) -> None:
        """Re-read the price book file and inventory's assets; soon again until inventory first answers."""
        while True:
            fetched = False
            try:
                await self.reload_pricebook_file()
                fetched = await self.refresh_assets()
            except _TICK_TROUBLE as exc:  # the next tick tries again
                self.log.warning("billing.refresh_failed", error=repr(exc))
            every = self.settings.inventory_refresh_s
            await asyncio.sleep(every if fetched else min(5.0, every))

    async def budget_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.budget_check_interval_s)
            try:
                await self.check_budgets()
            except _TICK_TROUBLE as exc:
                self.log.warning("billing.budget_check_failed", error=repr(exc))

    # ------------------------------------------------------------------ metering

    @batch_handler
    async def on_job_events(self, events: list[tuple[Envelope, EventData]]) -> list[Exception | None]:
        """A fetch of job events: who holds which GPU (the shared fold), placements, usage records, read in
        one round trip, decided event by event in stream order (ledger.py), written in one MULTI; acked
        (by the consumer) only after the write. An event whose placement is missing is retried (its
        job.placed comes on another subject; dead-lettered after 6), one from another node than its part's
        placement is dead-lettered at once; the others stand."""
        timed = [(data, env.time) for env, data in events]
        view = await self.store.ledger_view(*ledger.reads_for(timed))
        outcomes = ledger.job_events(timed, view)
        await self.store.commit_view(view)  # logged once per batch by the consumer (`events.handled`)
        return outcomes

    async def on_telemetry(self, env: Envelope, data: EventData) -> None:
        """Each GPU's sample joins its time series (running energy and utilization totals, energy.py); who
        held the GPU when is the ledger's business, so samples and job events may come in any order."""
        uuids = [g.uuid for g in data.gpus] if isinstance(data, GpuTelemetry) else []
        if not isinstance(data, GpuTelemetry) or not uuids:
            return
        lasts = await self.store.last_readings(uuids)
        await self.store.add_readings(energy.readings(data, lasts), dict(zip(uuids, lasts, strict=True)))

    # ------------------------------------------------------------------ price book and inventory

    async def pricebook(self) -> PriceBook:
        """The price book in force: the last good one stored, else the reference values."""
        book = await self.store.pricebook.current()
        return reference_book() if book is None else book

    async def apply_pricebook(self, text: str, source: str) -> PriceBook:
        """Check and store a price book; on PriceBookError the previous one stays in force."""
        return await self.store.pricebook.apply(text, source)

    async def reload_pricebook_file(self) -> bool:
        """Apply the price book file if its content changed; True if applied."""
        return await self.store.pricebook.reload_file(self.settings.pricebook_file)

    async def refresh_assets(self) -> bool:
        """Fetch inventory's GET /v1/assets into billing's own cache; False (and the reason kept) if unreachable."""
        now = self.now()
        url = self.settings.inventory_url.rstrip("/") + "/v1/assets"
        if self._http is None:
            self._http = httpx.AsyncClient()
        try:
            resp = await self._http.get(url, timeout=5.0, headers=self.settings.client_headers())
            resp.raise_for_status()
            # Typed at the boundary: a renamed or retyped field is a failed fetch, never a GPU priced as unknown.
            assets = ASSETS.validate_json(resp.content)
        except (httpx.HTTPError, ValidationError) as exc:
            await self.store.assets_failed(f"{type(exc).__name__}: {str(exc)[:200]}", now)
            return False
        await self.store.save_assets(assets, now)
        return True

    # ------------------------------------------------------------------ reports

    async def inputs(self, start: datetime, end: datetime, now: datetime) -> Inputs:
        store = self.store
        usage = await store.usage_columns(start, end)
        charged = costing.charged_intervals(usage, now)
        cache = await store.assets()
        terms, info = costing.inventory_terms(self.settings.inventory_url, cache.fetched_at, cache.assets,
                                              cache.error, cache.error_at)
        series = await store.series(costing.sample_points(charged.table, terms, start, end))
        return Inputs(usage, charged, terms, series, info)

    async def compute(self, start: datetime, end: datetime, now: datetime | None = None) -> Costed:
        """Chargeback over [start, end) with everything it was computed from."""
        now = now or self.now()
        book = await self.pricebook()
        return costing.compute(await self.inputs(start, end, now), book, start, end)

    async def job_records(self, job_id: str) -> list[dict[str, Any]]:
        """Every attempt of one job with its cost over its whole allocation."""
        # A gang's parts are one line: its GPUs on every node, charged once.
        records = merge_parts(await self.store.job_usage(job_id))
        now = self.now()
        out = []
        for r in records:
            start, end = costing.job_window(r, now)
            out.append(job_line(r, await self.compute(start, end, now)))
        return out

    # ------------------------------------------------------------------ budgets

    async def budget_statuses(self, now: datetime) -> list[BudgetStatus]:
        budgets = await self.store.budgets()
        if not budgets:
            return []
        first = history_start(now)
        start = costing.day_start(first)
        daily = costing.daily_spend(await self.inputs(start, now, now), await self.pricebook(), first, now)
        return [evaluate(b, daily.get((b.scope, b.name if b.scope != "cluster" else "all"), {}), now) for b in budgets]

    async def check_budgets(self) -> list[str]:
        """Publish the cost alerts due now and resolve those no longer due, each event once (budgets.py
        `alert_changes`); return their ids."""
        now = self.now()
        due = [a for s in await self.budget_statuses(now) for a in s.alerts]
        changes = alert_changes(due, await self.store.budget_alerts(), now)
        if not changes:
            return []
        staged = []
        for event_id, data, state in changes:
            subject = subjects.ALERT_RAISED if isinstance(data, AlertRaised) else subjects.ALERT_RESOLVED
            env = make_envelope(data, source=self.runtime.source, subject=data.fingerprint, event_id=event_id,
                                correlation_id=data.fingerprint, time=now)
            staged.append((subject, env, data.fingerprint, state))
        fired = await self.store.stage_alerts(staged)
        if fired:
            await self.runtime.publish_staged()
        summaries = {event_id: data.summary for event_id, data, _ in changes}
        for event_id in fired:
            self.log.info("budget.alert", event_id=event_id, summary=summaries[event_id])
        return fired
