"""Billing service: meters GPU time and energy per job attempt, prices it with the price book and
inventory's ownership terms, and answers chargeback, idle, budget, export and TCO questions.

Exactly once by construction: every ledger write is keyed by (job, attempt)
and is a pure function of the events, so a redelivered or replayed event
rewrites the same values. Costs are computed when asked, from the ledger, the
price book in force and the ownership terms, so a replay gives identical totals.
Decisions live in pricebook.py, ownership.py, allocation.py, budgets.py,
exports.py and tco.py; this module moves data between them, Redis, NATS and HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Literal

import httpx
from fastapi import Body, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from redis.exceptions import WatchError

from whaleflux.shared import subjects
from whaleflux.shared.bus import Retry
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import (
    AlertRaised,
    Envelope,
    GpuTelemetry,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRequeued,
    JobStarted,
    make_envelope,
)
from whaleflux.shared.configstore import StoredConfig
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from . import allocation as alloc
from .budgets import Budget, day_windows, evaluate, history_start
from .exports import FocusContext, focus_csv, focus_rows, jobs_csv
from .metering import UsageRecord, energy_delta, ended, intervals, ledger_key, merge_parts
from .ownership import GpuCost, GpuTerms, from_ms, gpu_cost, month_start, power_price, terms_from_assets, to_ms
from .pricebook import PriceBook, PriceBookError, entry_json, parse_pricebook, reference_book
from .pricing import MICRO
from .tco import TcoInput, tco

HOUR_MS = 3_600_000
_budgets = TypeAdapter(list[Budget])


class BillingSettings(CommonSettings):
    http_port: int = 8704
    inventory_url: str = Field("http://127.0.0.1:8705", description="inventory service, for GET /v1/assets")
    inventory_refresh_s: float = Field(60.0, gt=0, description="how often ownership terms are fetched")
    pricebook_file: str | None = Field(None, description="price book YAML; re-read when its content changes")
    budget_check_interval_s: float = Field(300.0, gt=0)
    energy_retention_days: float = Field(400.0, gt=0)
    billing_account_id: str = "whaleflux"
    billing_account_name: str = "WhaleFlux GPU fleet"


def plain(obj):
    """JSON-ready: Decimals as strings (never floats), datetimes ISO, dataclasses as dicts."""
    if isinstance(obj, Decimal):
        return format(obj, "f")
    if isinstance(obj, (datetime, date)):
        return obj.isoformat()
    if isinstance(obj, BaseModel):
        return plain(obj.model_dump())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [plain(v) for v in (sorted(obj) if isinstance(obj, set) else obj)]
    return obj


@dataclasses.dataclass
class Inputs:
    """Everything one report needs, read from Redis once."""

    records: list[UsageRecord]
    terms: dict[str, GpuTerms]
    energy: list[alloc.EnergyUse]
    util: dict[str, tuple[float, int]]
    pricing: dict


class BillingService(ServiceBase):
    name = "billing"

    def __init__(self, settings: BillingSettings, **kw):
        super().__init__(settings, **kw)
        self.settings: BillingSettings = settings
        self._stored_book: StoredConfig[PriceBook] | None = None
        self._http: httpx.AsyncClient | None = None

    def consumers(self):
        return {"billing-jobs": self.on_job_event, "billing-telemetry": self.on_telemetry}

    def k(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def _alloc_key(self, job_id: str, attempt: int, rank: int = 0) -> str:
        return f"{self.prefix}:alloc:{ledger_key(job_id, attempt, rank)}"

    # ---------------------------------------------------------------- metering

    async def on_job_event(self, env: Envelope, data) -> None:
        if isinstance(data, JobPlaced):
            await self.redis.set(self._alloc_key(data.job_id, data.attempt, data.part), data.model_dump_json())
        elif isinstance(data, JobStarted):
            await self._record(data.job_id, data.attempt, data.started_at, None, "running", data.rank or 0)
        elif isinstance(data, JobFinished):
            await self._record(data.job_id, data.attempt, data.started_at, data.finished_at, "finished", data.rank or 0)
        elif isinstance(data, JobFailed) and data.started_at is not None:
            await self._record(data.job_id, data.attempt, data.started_at, data.failed_at, "failed", data.rank or 0)
        elif isinstance(data, JobRequeued):
            for rank in range(len(data.gang_nodes or ()) or 1):
                await self._end_requeued(data.job_id, data.attempt, env.time, rank)

    async def _end_requeued(self, job_id: str, attempt: int, at: datetime, rank: int = 0) -> None:
        """A requeued attempt stops accruing when the scheduler took its GPUs back (every part of a gang).

        The agent of a lost node never reports the end; if the agent does report
        it later (a preempted job stopping after its grace period), that report
        replaces this end: still one record per attempt (per part of a gang).
        """
        raw = await self.redis.hget(self.k("usage"), ledger_key(job_id, attempt, rank))
        if raw is None:
            return  # placed but never started: nothing ran, nothing to charge
        record = UsageRecord.model_validate_json(raw)
        if record.ended_at is None:
            await self._record(job_id, attempt, record.started_at, max(at, record.started_at), "requeued", rank)

    async def _record(self, job_id: str, attempt: int, started: datetime, end: datetime | None, state: str,
                      rank: int = 0) -> None:
        raw = await self.redis.get(self._alloc_key(job_id, attempt, rank))
        if raw is None:
            raise Retry(f"no placement recorded for job {job_id} attempt {attempt}" + (f" rank {rank}" if rank else ""))
        placed = JobPlaced.model_validate_json(raw)
        key = f"{job_id}:{attempt}"  # the attempt, which every part's GPUs are charged to
        ledger = ledger_key(job_id, attempt, rank)
        current = await self.redis.hget(self.k("usage"), ledger)
        if end is None and current is not None and UsageRecord.model_validate_json(current).ended_at is not None:
            return  # job.started replayed after its end: the ended record stands
        record = UsageRecord(
            job_id=job_id, attempt=attempt, team=placed.team, project=placed.project, gpu_model=placed.gpu_model,
            gpus=len(placed.gpu_uuids), node=placed.node, cluster=placed.cluster, gpu_uuids=placed.gpu_uuids,
            started_at=started, state="running", rank=rank,
        )
        if end is not None:
            record = ended(record, end, state)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.k("usage"), ledger, record.model_dump_json())
            if end is None:
                pipe.hset(self.k("gpu:open"), mapping={g: key for g in placed.gpu_uuids})
            await pipe.execute()
        if end is not None:
            holders = await self.redis.hmget(self.k("gpu:open"), placed.gpu_uuids)
            stale = [g for g, h in zip(placed.gpu_uuids, holders) if h == key]
            if stale:
                await self.redis.hdel(self.k("gpu:open"), *stale)
        self.log.debug("usage.recorded", job_id=job_id, attempt=attempt, state=record.state)

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        """Energy drawn per GPU and hour (and per job holding it), and utilization while allocated."""
        uuids = [g.uuid for g in data.gpus]
        if not uuids:
            return
        t_ms = to_ms(data.sample_time)
        hour = t_ms - t_ms % HOUR_MS
        lasts = await self.redis.hmget(self.k("energy:last"), uuids)
        holders = await self.redis.hmget(self.k("gpu:open"), uuids)
        ekey = self.k(f"energy:{hour}")
        async with self.redis.pipeline(transaction=False) as pipe:
            touched = False
            for g, last_raw, holder in zip(data.gpus, lasts, holders):
                last = None
                if last_raw:
                    ms, _, joules = last_raw.partition("|")
                    last = (int(ms), float(joules) if joules else None)
                if last is not None and t_ms <= last[0]:
                    continue  # a redelivered or older sample: counted already
                if g.energy_j is not None:
                    delta, _ = energy_delta(last if last and last[1] is not None else None, t_ms, g.energy_j)
                    if delta > 0:
                        pipe.hincrbyfloat(ekey, g.uuid, delta)
                        if holder:
                            pipe.hincrbyfloat(ekey, f"{g.uuid}|{holder}", delta)
                        touched = True
                pipe.hset(self.k("energy:last"), g.uuid, f"{t_ms}|{'' if g.energy_j is None else repr(g.energy_j)}")
                if holder:
                    pipe.hincrbyfloat(self.k("util:job"), f"{holder}|s", g.utilization_gpu_pct)
                    pipe.hincrby(self.k("util:job"), f"{holder}|n", 1)
            if touched:
                pipe.zadd(self.k("energy:hours"), {str(hour): hour})
                pipe.expire(ekey, int(self.settings.energy_retention_days * 86400))
            await pipe.execute()

    # ---------------------------------------------------------------- price book

    @property
    def stored_book(self) -> StoredConfig[PriceBook]:
        """The price book document kept in Redis (file or upload; the last good one stays)."""
        if self._stored_book is None:
            self._stored_book = StoredConfig(self.redis, self.k("pricebook"), parse_pricebook, self.clock, self.log, "pricebook")
        return self._stored_book

    async def pricebook(self) -> PriceBook:
        """The price book in force: the last good one stored, else the reference values."""
        book = await self.stored_book.current()
        return reference_book() if book is None else book

    async def apply_pricebook(self, text: str, source: str, file_hash: str | None = None) -> PriceBook:
        """Check and store a price book; on PriceBookError the previous one stays in force."""
        return await self.stored_book.apply(text, source, file_hash)

    async def reload_pricebook_file(self) -> bool:
        """Apply the price book file if its content changed; True if applied."""
        return await self.stored_book.reload_file(self.settings.pricebook_file)

    # ---------------------------------------------------------------- ownership from inventory

    async def refresh_assets(self) -> bool:
        """Fetch inventory's GET /v1/assets into billing's own cache; False (and the reason kept) if unreachable."""
        now = self.clock()
        url = self.settings.inventory_url.rstrip("/") + "/v1/assets"
        try:
            resp = await self._http.get(url, timeout=5.0)
            resp.raise_for_status()
            assets = resp.json()
            if not isinstance(assets, list) or not all(isinstance(a, dict) and "uuid" in a and "model" in a for a in assets):
                raise ValueError("unexpected response shape")
        except (httpx.HTTPError, ValueError) as exc:
            await self.redis.hset(self.k("assets:status"), mapping={
                "error": f"{type(exc).__name__}: {str(exc)[:200]}", "error_at": now.isoformat()})
            return False
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.k("assets"), json.dumps({"fetched_at": now.isoformat(), "assets": assets}))
            for a in assets:
                pipe.hsetnx(self.k("assets:first_seen"), a["uuid"], now.isoformat())
            pipe.hset(self.k("assets:status"), mapping={"ok_at": now.isoformat(), "error": ""})
            await pipe.execute()
        return True

    async def _terms(self) -> tuple[dict[str, GpuTerms], dict]:
        raw = await self.redis.get(self.k("assets"))
        status = await self.redis.hgetall(self.k("assets:status"))
        info = {"url": self.settings.inventory_url, "fetched_at": None, "error": status.get("error") or None,
                "error_at": status.get("error_at") if status.get("error") else None}
        if raw is None:
            info["basis"] = "price book model defaults (inventory unreachable: ownership unknown, reference prices, no idle line)"
            return {}, info
        doc = json.loads(raw)
        first = {u: datetime.fromisoformat(t) for u, t in (await self.redis.hgetall(self.k("assets:first_seen"))).items()}
        info["fetched_at"] = doc["fetched_at"]
        info["basis"] = "inventory ownership terms" + (" (cached; inventory unreachable now)" if info["error"] else "")
        return terms_from_assets(doc["assets"], first), info

    # ---------------------------------------------------------------- reports

    async def inputs(self, start: datetime, end: datetime) -> Inputs:
        raw = await self.redis.hgetall(self.k("usage"))
        records = []
        for v in raw.values():
            r = UsageRecord.model_validate_json(v)
            if r.started_at < end and (r.ended_at is None or r.ended_at > start):
                records.append(r)
        terms, info = await self._terms()
        hours = [int(h) for h in await self.redis.zrangebyscore(self.k("energy:hours"), to_ms(start) - HOUR_MS, to_ms(end))]
        energy = []
        if hours:
            async with self.redis.pipeline(transaction=False) as pipe:
                for h in hours:
                    pipe.hgetall(self.k(f"energy:{h}"))
                results = await pipe.execute()
            for h, fields in zip(hours, results):
                per_gpu: dict[str, list] = defaultdict(lambda: [0.0, []])
                for name, value in fields.items():
                    gpu, _, job = name.partition("|")
                    if job:
                        per_gpu[gpu][1].append((job, float(value)))
                    else:
                        per_gpu[gpu][0] = float(value)
                energy += [alloc.EnergyUse(g, h, tot, tuple(sorted(jobs))) for g, (tot, jobs) in sorted(per_gpu.items())]
        util_raw = await self.redis.hgetall(self.k("util:job"))
        util: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for name, value in util_raw.items():
            job, _, part = name.rpartition("|")
            if part == "s":
                util[job][0] = float(value)
            else:
                util[job][1] = int(value)
        return Inputs(records, terms, energy, {k: (v[0], v[1]) for k, v in util.items()}, info)

    def _costs(self, inp: Inputs, book: PriceBook, start: datetime, end: datetime) -> tuple[dict[str, GpuCost], list[str]]:
        """Fixed-cost timelines of every GPU in the fleet and every GPU a job held."""
        notes = []
        terms = dict(inp.terms)
        for r in inp.records:
            for g in r.gpu_uuids:
                if g not in terms:
                    if inp.terms:
                        notes.append(f"GPU {g} (job {r.job_id}) is not in inventory; priced at the {r.gpu_model} default")
                    terms[g] = GpuTerms(uuid=g, model=r.gpu_model, ownership="unknown", pool=r.cluster or "unknown",
                                        node=r.node, cluster=r.cluster)
        out = {}
        for uuid, t in terms.items():
            try:
                out[uuid] = gpu_cost(t, book, start, end)
            except ValueError as exc:
                notes.append(f"{exc}: charged 0 until the price book has one")
                out[uuid] = GpuCost(t, usage_only=True)
        return out, list(dict.fromkeys(notes))

    def _kwh_prices(self, inp: Inputs, gpus: dict[str, GpuCost], book: PriceBook) -> dict[tuple[str, int], Decimal]:
        prices = {}
        for use in inp.energy:
            gc = gpus.get(use.gpu)
            if gc is not None:
                p = power_price(gc.terms, book, from_ms(use.hour_ms))
                if p is not None:
                    prices[(use.gpu, use.hour_ms)] = p
        return prices

    async def compute(self, start: datetime, end: datetime, now: datetime | None = None):
        """Chargeback over [start, end) with everything it was computed from."""
        now = now or self.clock()
        book = await self.pricebook()
        inp = await self.inputs(start, end)
        gpus, notes = self._costs(inp, book, start, end)
        ivs, jobs = intervals(inp.records, now)
        cb = alloc.chargeback(ivs, jobs, gpus, to_ms(start), to_ms(end), inp.energy,
                              self._kwh_prices(inp, gpus, book), inp.util)
        cb.notes = notes + cb.notes
        return cb, inp, gpus, ivs, jobs, book

    def _window(self, start: datetime | None, end: datetime | None) -> tuple[datetime, datetime]:
        now = self.clock()
        end = end or now
        start = start or month_start(end if end <= now else now)
        for name, t in (("from", start), ("to", end)):
            if t.tzinfo is None:
                raise HTTPException(400, f"{name}: give a timezone (e.g. 2026-01-01T00:00:00Z)")
        if end <= start:
            raise HTTPException(400, "from/to: `to` must be after `from`")
        if end - start > timedelta(days=400):
            raise HTTPException(400, "from/to: at most 400 days")
        return start.astimezone(timezone.utc), end.astimezone(timezone.utc)

    def _report(self, cb: alloc.Chargeback, inp: Inputs, book: PriceBook, by: str, share_idle: bool,
                running: bool = False) -> dict:
        sb = alloc.showback(cb, by, share_idle, running)
        rows = plain(sb.rows)
        # Utilization is measured live and not rebuilt by a replay: beside the rows, so rows stay a pure
        # function of the job stream and the prices.
        efficiency = {r["key"]: r.pop("efficiency_pct") for r in rows}
        return {
            "by": by,
            "from": from_ms(cb.start_ms).isoformat(), "to": from_ms(cb.end_ms).isoformat(),
            "rows": rows,
            "efficiency_pct": efficiency,
            "idle": plain(sb.idle),
            "total_usd": plain(sb.allocated_usd),
            "totals": {"fleet_usd": plain(sb.fleet_usd), "allocated_usd": plain(sb.allocated_usd),
                       "idle_usd": plain(sb.idle_usd), "unshared_idle_usd": plain(sb.unshared_idle_usd),
                       "running_usd": plain(sb.running_usd), "share_idle": share_idle, "running_as_rows": running},
            "pricing": {"inventory": inp.pricing, "pricebook": book.source, "notes": cb.notes,
                        "rounding": "per job and rate segment to 1e-6 USD; shown cents apportioned so lines add up to the fleet total"},
            "rates": {e.model: {"usd_per_gpu_hour": plain(e.usd_per_gpu_hour), "source": e.source, "as_of": e.as_of,
                                "reference": e.reference}
                      for e in book.all_entries()[::-1] if e.ownership == "cloud"},
        }

    async def job_records(self, job_id: str) -> list[dict]:
        """Every attempt of one job with its cost over its whole allocation."""
        raw = await self.redis.hgetall(self.k("usage"))
        # A gang's parts are one line: its GPUs on every node, charged once.
        records = merge_parts([UsageRecord.model_validate_json(v) for k, v in raw.items() if k.rsplit(":", 1)[0] == job_id])
        out = []
        now = self.clock()
        for r in records:
            end = r.ended_at or now
            if end <= r.started_at:
                end = r.started_at + timedelta(milliseconds=1)
            cb, *_ = await self.compute(r.started_at, end, now)
            jc = cb.jobs.get(r.key)
            usd = jc.usd if jc else Decimal(0)
            hours = r.gpu_seconds / 3600 if r.ended_at else Decimal(jc.gpu_ms if jc else 0) / HOUR_MS
            rate = (usd / hours).quantize(Decimal("0.0001")) if hours else Decimal(0)
            out.append({**r.model_dump(mode="json"), "gpu_seconds": plain(r.gpu_seconds),
                        "cost_usd": plain(usd.quantize(MICRO)), "fixed_usd": plain(jc.fixed_usd if jc else Decimal(0)),
                        "power_usd": plain(jc.power_usd if jc else Decimal(0)), "usd_per_gpu_hour": plain(rate),
                        "efficiency_pct": None if not jc or jc.util_mean is None else round(jc.util_mean, 1)})
        return out

    # ---------------------------------------------------------------- budgets

    async def budgets(self) -> list[Budget]:
        raw = await self.redis.get(self.k("budgets"))
        return _budgets.validate_json(raw) if raw else []

    async def budget_statuses(self, now: datetime):
        budgets = await self.budgets()
        if not budgets:
            return []
        first = history_start(now)
        start = datetime(first.year, first.month, first.day, tzinfo=timezone.utc)
        book = await self.pricebook()
        inp = await self.inputs(start, now)
        gpus, _ = self._costs(inp, book, start, now)
        ivs, jobs = intervals(inp.records, now)
        prices = self._kwh_prices(inp, gpus, book)
        daily: dict[tuple[str, str], dict[date, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
        for lo, hi in day_windows(first, now):
            day_gpus = {u: gpu_cost(g.terms, book, lo, hi) if not g.usage_only or g.segments else g for u, g in gpus.items()}
            cb = alloc.chargeback(ivs, jobs, day_gpus, to_ms(lo), to_ms(hi), inp.energy, prices)
            d = lo.date()
            daily[("cluster", "all")][d] += cb.fleet_usd
            for jc in cb.jobs.values():
                daily[("team", jc.info.team)][d] += jc.usd
                daily[("project", jc.info.project)][d] += jc.usd
        return [evaluate(b, daily.get((b.scope, b.name if b.scope != "cluster" else "all"), {}), now) for b in budgets]

    async def check_budgets(self) -> list[str]:
        """Publish the cost alerts due now, each once (ids fixed by content); return their ids."""
        now = self.clock()
        statuses = await self.budget_statuses(now)
        due = [a for s in statuses for a in s.alerts]
        if not due:
            return []
        key = self.k("budget:fired")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                # WATCH: two replicas checking at once stage each alert once.
                await pipe.watch(key)
                fired = set(await pipe.smembers(key))
                new = [a for a in due if a.event_id not in fired]
                if not new:
                    return []
                pipe.multi()
                pipe.sadd(key, *[a.event_id for a in new])
                for a in new:
                    data = AlertRaised(fingerprint=a.fingerprint, rule=a.rule, severity=a.severity, category="cost",
                                       summary=a.summary, labels={"alertname": a.rule, **a.labels}, value=a.value,
                                       starts_at=now)
                    env = make_envelope(data, source=f"whaleflux/billing/{self.settings.instance}",
                                        subject=a.fingerprint, event_id=a.event_id, correlation_id=a.fingerprint,
                                        time=now)
                    self.outbox.stage(pipe, subjects.ALERT_RAISED, env)
                await pipe.execute()
        except WatchError:
            return []
        await self.publish_staged()
        for a in new:
            self.log.info("budget.alert", event_id=a.event_id, summary=a.summary)
        return [a.event_id for a in new]

    # ---------------------------------------------------------------- lifecycle

    async def on_ready(self) -> None:
        self._http = httpx.AsyncClient()
        await self.publish_staged()
        await self.reload_pricebook_file()

    async def stop(self) -> None:
        await super().stop()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def background(self):
        return [self._inventory_loop, self._budget_loop]

    async def _inventory_loop(self) -> None:
        while True:
            fetched = False
            try:
                await self.reload_pricebook_file()
                fetched = await self.refresh_assets()
            except Exception as exc:  # the next tick tries again
                self.log.warning("billing.refresh_failed", error=repr(exc))
            # Inventory may start after billing: retry soon until the first answer comes.
            await asyncio.sleep(self.settings.inventory_refresh_s if fetched else min(5.0, self.settings.inventory_refresh_s))

    async def _budget_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.budget_check_interval_s)
            try:
                await self.check_budgets()
            except Exception as exc:
                self.log.warning("billing.budget_check_failed", error=repr(exc))

    # ---------------------------------------------------------------- HTTP

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/costs", tags=["costs"])
        async def costs(
            by: Literal["job", "team", "project", "model"] = "team",
            start: datetime | None = Query(None, alias="from", description="default: start of this month (UTC)"),
            end: datetime | None = Query(None, alias="to", description="default: now"),
            share_idle: bool = Query(False, description="share each pool's idle cost back in proportion to use"),
            running: bool = Query(False, description="show attempts still running as rows (else one running_usd line)"),
        ) -> JSONResponse:
            """Chargeback over a window: rows per job/team/project/model, idle per pool and model, the fleet total."""
            lo, hi = self._window(start, end)
            cb, inp, _, _, _, book = await self.compute(lo, hi)
            return JSONResponse(self._report(cb, inp, book, by, share_idle, running))

        @app.get("/v1/costs/jobs/{job_id}", tags=["costs"])
        async def job_cost(job_id: str) -> JSONResponse:
            """Every metered attempt of one job, with its cost."""
            records = await self.job_records(job_id)
            if not records:
                raise HTTPException(404, f"no usage recorded for job {job_id!r}")
            return JSONResponse(records)

        @app.get("/v1/costs/export", tags=["costs"])
        async def export(
            format: Literal["focus", "csv", "json"] = "focus",
            start: datetime | None = Query(None, alias="from"),
            end: datetime | None = Query(None, alias="to"),
            by: Literal["job", "team", "project", "model"] = "job",
        ):
            """FOCUS 1.2 CSV, a CSV of job attempts and idle lines, or the JSON report."""
            lo, hi = self._window(start, end)
            cb, inp, gpus, ivs, jobs, book = await self.compute(lo, hi)
            if format == "json":
                return JSONResponse(self._report(cb, inp, book, by, False))
            if format == "csv":
                return PlainTextResponse(jobs_csv(cb), media_type="text/csv")
            ctx = FocusContext(self.settings.billing_account_id, self.settings.billing_account_name)
            rows = focus_rows(ivs, jobs, gpus, to_ms(lo), to_ms(hi), inp.energy, self._kwh_prices(inp, gpus, book), ctx)
            return PlainTextResponse(focus_csv(rows), media_type="text/csv")

        @app.get("/v1/pricebook", tags=["pricebook"])
        async def pricebook_view() -> JSONResponse:
            """Price entries in force (the operator's, then reference values), where they came from, the last rejection."""
            book = await self.pricebook()
            meta = await self.redis.hgetall(self.k("pricebook"))
            error = await self.redis.get(self.k("pricebook:error"))
            return JSONResponse({
                "source": book.source, "applied_at": meta.get("applied_at"),
                "entries": [entry_json(e) for e in book.entries],
                "reference": [entry_json(e) for e in book.reference],
                "last_error": json.loads(error) if error else None,
            })

        @app.put("/admin/pricebook", tags=["admin"], dependencies=[admin])
        async def pricebook_upload(request: Request) -> dict:
            """Replace the price book with the YAML body; 422 lists every problem (line, key), nothing changes."""
            body = (await request.body()).decode("utf-8", errors="replace")
            try:
                book = await self.apply_pricebook(body, "upload")
            except PriceBookError as exc:
                raise HTTPException(422, detail={"errors": exc.errors}) from None
            return {"applied": True, "entries": len(book.entries)}

        @app.get("/v1/budgets", tags=["budgets"])
        async def budgets_view() -> JSONResponse:
            """Each budget: spend to date, burn-rate and trend projections, last week against its forecast."""
            return JSONResponse(plain(await self.budget_statuses(self.clock())))

        @app.put("/admin/budgets", tags=["admin"], dependencies=[admin])
        async def budgets_upload(body: list = Body(...)) -> dict:
            """Replace the budgets (a JSON list); 422 names the bad field."""
            try:
                budgets = _budgets.validate_python(body)
            except ValidationError as exc:
                errors = [f"[{']['.join(str(p) for p in e['loc'])}]: {e['msg']}"
                          for e in exc.errors(include_url=False, include_input=False, include_context=False)]
                raise HTTPException(422, detail={"errors": errors}) from None
            await self.redis.set(self.k("budgets"), _budgets.dump_json(budgets))
            return {"budgets": len(budgets), "alerts_published": await self.check_budgets()}

        @app.get("/v1/tco", tags=["costs"])
        async def tco_view(
            model: str, gpus: int = Query(8, ge=1, le=100000), utilization: Decimal = Query(Decimal("0.6"), ge=0, le=1),
            months: int = Query(36, ge=1, le=120),
            purchase_price: Decimal | None = Query(None, ge=0), depreciation_months: int | None = Query(None, ge=1),
            usd_per_kwh: Decimal | None = Query(None, ge=0), overhead: Decimal | None = Query(None, ge=0),
            lease_monthly: Decimal | None = Query(None, ge=0), cloud_hourly: Decimal | None = Query(None, ge=0),
        ) -> JSONResponse:
            """Own vs lease vs cloud for a workload; prices not given come from the price book in force."""
            return JSONResponse(await self._tco(model, gpus, utilization, months, purchase_price, depreciation_months,
                                                usd_per_kwh, overhead, lease_monthly, cloud_hourly))

    async def _tco(self, model, gpus, utilization, months, purchase_price, depreciation_months, usd_per_kwh,
                   overhead, lease_monthly, cloud_hourly) -> dict:
        from whaleflux.shared.catalog import model_key

        key = model_key(model)
        if key is None:
            raise HTTPException(400, f"model: unknown GPU model {model!r} (known: {', '.join(sorted(gpu_models()))})")
        now = self.clock()
        book = await self.pricebook()
        owned, leased, cloud = (book.lookup(key, o, now) for o in ("owned", "leased", "cloud"))
        purchase_price = purchase_price if purchase_price is not None else (owned.purchase_price_per_gpu if owned else None)
        usd_per_kwh = usd_per_kwh if usd_per_kwh is not None else (owned.usd_per_kwh if owned else None)
        overhead = overhead if overhead is not None else (owned.overhead_per_gpu_month if owned else None)
        missing = [n for n, v in (("purchase_price", purchase_price), ("usd_per_kwh", usd_per_kwh),
                                  ("overhead", overhead)) if v is None]
        cloud_hourly = cloud_hourly if cloud_hourly is not None else (cloud.usd_per_gpu_hour if cloud else None)
        if cloud_hourly is None:
            missing.append("cloud_hourly")
        if missing:
            raise HTTPException(400, f"{', '.join(missing)}: no owned/cloud {key} entry in the price book; pass it")
        spec = gpu_models()[key]
        result = tco(TcoInput(
            model=key, gpus=gpus, utilization=utilization, months=months, purchase_price_per_gpu=purchase_price,
            depreciation_months=depreciation_months or (owned.depreciation_months if owned else 36),
            usd_per_kwh=usd_per_kwh, overhead_per_gpu_month=overhead,
            lease_monthly_per_gpu=lease_monthly if lease_monthly is not None else (leased.monthly_price_per_gpu if leased else None),
            lease_minimum_months=leased.minimum_term_months if leased else 1, cloud_hourly_per_gpu=cloud_hourly,
            tdp_w=Decimal(str(spec.tdp_w)), idle_w=Decimal(str(spec.idle_power_w)),
        ))
        sources = {o: (e.source + (f" (reference, {e.as_of})" if e.reference else "")) for o, e in
                   (("owned", owned), ("leased", leased), ("cloud", cloud)) if e is not None}
        return {**plain(result), "sources": sources}


def main() -> None:
    run_service(BillingService(BillingSettings()))
