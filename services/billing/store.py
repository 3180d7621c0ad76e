"""Billing's Redis state: every key and encoding it keeps under `wf:billing`, behind typed methods.

Nothing else in billing talks to Redis. The keys (docs/services/billing.md):
`alloc:<ledger>` (the `job.placed` data), `usage` (ledger -> usage record),
`holds` and `gpu:holder` (the GPU-holder fold: job -> its holds, GPU -> the
part holding it), `energy:last`, `energy:<hour ms>`, `energy:hours`,
`util:job`, `assets`, `assets:status`, `pricebook`,
`pricebook:error`, `budgets`, `budget:fired`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from redis.asyncio import Redis
from redis.exceptions import WatchError

from whaleflux.shared.configstore import StoredConfig
from whaleflux.shared.contracts import ASSETS, Asset, Holder, JobHolds
from whaleflux.shared.events import Envelope, JobPlaced
from whaleflux.shared.outbox import Outbox

from .allocation import EnergyUse
from .budgets import Budget
from .energy import EnergyUpdate, Reading
from .ledger import JobEventOutcome, JobEventState
from .metering import UsageRecord
from .pricebook import PriceBook, parse_pricebook

HOUR_MS = 3_600_000
_budgets = TypeAdapter(list[Budget])
Raw = bytes | str  # what redis-py's types say a reply holds; with decode_responses=True it is always str


def _s(value: Raw) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt(value: Raw | None) -> str | None:
    return None if value is None else _s(value)


def _strs(mapping: dict[Raw, Raw]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in mapping.items()}


def _holder(raw: Raw | None) -> Holder | None:
    return None if raw is None else Holder.decode(_s(raw))


@dataclass(frozen=True)
class AssetsCache:
    """What billing last heard from inventory's `GET /v1/assets`, and how the last fetch went."""

    fetched_at: str | None  # ISO time of the last good fetch; None: never fetched
    assets: list[Asset]  # the last good answer
    error: str | None
    error_at: str | None


class BillingStore:
    """Typed access to billing's keys; `prefix` is the runtime's (`wf:billing`)."""

    def __init__(self, redis: Redis, prefix: str, outbox: Outbox, energy_ttl_s: int,
                 clock: Callable[[], datetime], log: Any):
        self.redis = redis
        self.prefix = prefix
        self.outbox = outbox
        self.energy_ttl_s = energy_ttl_s
        self.pricebook = StoredConfig[PriceBook](redis, self._k("pricebook"), parse_pricebook, clock, log,
                                                 "pricebook")

    def _k(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # ------------------------------------------------------------------ ledger

    async def job_event_state(self, job_id: str, gpus: Sequence[str], ledgers: Sequence[str]) -> JobEventState:
        """What one job event's outcome depends on, in one round trip (two when the job holds GPUs the
        event does not name): the job's holds, the holders of `gpus` and of the job's GPUs, and the usage
        record and placement of each of `ledgers`."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._k("holds"), job_id)
            for ledger in ledgers:
                pipe.hget(self._k("usage"), ledger)
                pipe.get(self._k(f"alloc:{ledger}"))
            if gpus:
                pipe.hmget(self._k("gpu:holder"), list(gpus))
            raw_holds, *rest = await pipe.execute()
        raw_holders = rest.pop() if gpus else []
        holds = JobHolds() if raw_holds is None else JobHolds.decode(_s(raw_holds))
        holders = {g: _holder(h) for g, h in zip(gpus, raw_holders, strict=True)}
        missing = sorted(holds.gpus() - set(holders))
        holders.update(zip(missing, await self.holders(missing), strict=True))
        usage = {ledger: None if u is None else UsageRecord.model_validate_json(_s(u))
                 for ledger, u in zip(ledgers, rest[0::2], strict=True)}
        placements = {ledger: None if p is None else JobPlaced.model_validate_json(_s(p))
                      for ledger, p in zip(ledgers, rest[1::2], strict=True)}
        return JobEventState(holds, holders, usage, placements)

    async def commit_job_event(self, job_id: str, outcome: JobEventOutcome) -> None:
        """Write one job event's outcome in one transaction: the fold, usage records, the placement."""
        change = outcome.holders
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._k("holds"), job_id, change.job.encode())
            if change.hold:
                pipe.hset(self._k("gpu:holder"), mapping={g: h.encode() for g, h in change.hold.items()})
            if change.release:
                pipe.hdel(self._k("gpu:holder"), *change.release)
            for record in outcome.records:
                pipe.hset(self._k("usage"), record.ledger_key, record.model_dump_json())
            if outcome.placement is not None:
                ledger, placed = outcome.placement
                pipe.set(self._k(f"alloc:{ledger}"), placed.model_dump_json())
            await pipe.execute()

    async def usage_records(self) -> list[UsageRecord]:
        """Every record of the ledger (one per attempt, per part of a gang)."""
        raw = await self.redis.hgetall(self._k("usage"))
        return [UsageRecord.model_validate_json(v) for v in raw.values()]

    async def job_usage(self, job_id: str) -> list[UsageRecord]:
        """The records of one job's attempts (every part of a gang)."""
        raw = _strs(await self.redis.hgetall(self._k("usage")))
        return [UsageRecord.model_validate_json(v) for k, v in raw.items() if k.rsplit(":", 1)[0] == job_id]

    async def holders(self, gpus: Sequence[str]) -> list[Holder | None]:
        """The part of an attempt holding each GPU (the shared GPU-holder fold), or None."""
        if not gpus:
            return []
        return [_holder(h) for h in await self.redis.hmget(self._k("gpu:holder"), list(gpus))]

    # ------------------------------------------------------------------ energy and utilization

    async def readings_and_holders(self, gpus: Sequence[str]) -> tuple[list[Reading | None], list[Holder | None]]:
        """Each GPU's last energy counter reading (kept as `<sample ms>|<joules or empty>`) and its holder."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._k("energy:last"), list(gpus))
            pipe.hmget(self._k("gpu:holder"), list(gpus))
            lasts, holders = await pipe.execute()
        readings: list[Reading | None] = []
        for raw in lasts:
            if not raw:
                readings.append(None)
                continue
            ms, _, joules = _s(raw).partition("|")
            readings.append(Reading(int(ms), float(joules) if joules else None))
        return readings, [_holder(h) for h in holders]

    async def apply_energy(self, update: EnergyUpdate) -> None:
        """Add one telemetry batch's energy and utilization, and keep its readings, in one round trip."""
        ekey = self._k(f"energy:{update.hour_ms}")
        async with self.redis.pipeline(transaction=False) as pipe:
            for gpu, holder, joules in update.joules:
                pipe.hincrbyfloat(ekey, gpu, joules)
                if holder:
                    pipe.hincrbyfloat(ekey, f"{gpu}|{holder}", joules)
            for gpu, reading in update.readings.items():
                value = "" if reading.joules is None else repr(reading.joules)
                pipe.hset(self._k("energy:last"), gpu, f"{reading.t_ms}|{value}")
            for holder, util in update.util:
                pipe.hincrbyfloat(self._k("util:job"), f"{holder}|s", util)
                pipe.hincrby(self._k("util:job"), f"{holder}|n", 1)
            if update.joules:
                pipe.zadd(self._k("energy:hours"), {str(update.hour_ms): update.hour_ms})
                pipe.expire(ekey, self.energy_ttl_s)
            await pipe.execute()

    async def energy_hour(self, hour_ms: int, gpu: str) -> float | None:
        """Joules one GPU drew in one hour, as counted so far."""
        raw = await self.redis.hget(self._k(f"energy:{hour_ms}"), gpu)
        return None if raw is None else float(raw)

    async def energy(self, start_ms: int, end_ms: int) -> list[EnergyUse]:
        """Energy per GPU and hour for hours starting in [start_ms - 1 h, end_ms], with each attempt's part."""
        found = await self.redis.zrangebyscore(self._k("energy:hours"), start_ms - HOUR_MS, end_ms)
        hours = [int(_s(h)) for h in found if isinstance(h, (bytes, str))]
        if not hours:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in hours:
                pipe.hgetall(self._k(f"energy:{h}"))
            results = await pipe.execute()
        energy: list[EnergyUse] = []
        for h, fields in zip(hours, results, strict=True):
            totals: dict[str, float] = defaultdict(float)
            by_job: dict[str, list[tuple[str, float]]] = defaultdict(list)
            for name, value in _strs(fields).items():
                gpu, _, job = name.partition("|")
                if job:
                    by_job[gpu].append((job, float(value)))
                else:
                    totals[gpu] = float(value)
            for gpu in sorted(set(totals) | set(by_job)):
                energy.append(EnergyUse(gpu, h, totals.get(gpu, 0.0), tuple(sorted(by_job.get(gpu, ())))))
        return energy

    async def utilization(self) -> dict[str, tuple[float, int]]:
        """Attempt -> (sum, count) of its GPUs' utilization samples while allocated."""
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for name, value in _strs(await self.redis.hgetall(self._k("util:job"))).items():
            job, _, part = name.rpartition("|")
            if part == "s":
                sums[job] = float(value)
            else:
                counts[job] = int(value)
        return {job: (sums.get(job, 0.0), counts.get(job, 0)) for job in sums.keys() | counts.keys()}

    # ------------------------------------------------------------------ inventory's assets

    async def save_assets(self, assets: list[Asset], now: datetime) -> None:
        """Keep a good answer of inventory."""
        at = now.isoformat()
        doc = {"fetched_at": at, "assets": ASSETS.dump_python(assets, mode="json")}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._k("assets"), json.dumps(doc))
            pipe.hset(self._k("assets:status"), mapping={"ok_at": at, "error": ""})
            await pipe.execute()

    async def assets_failed(self, error: str, now: datetime) -> None:
        await self.redis.hset(self._k("assets:status"), mapping={"error": error, "error_at": now.isoformat()})

    async def assets(self) -> AssetsCache:
        raw = await self.redis.get(self._k("assets"))
        status = _strs(await self.redis.hgetall(self._k("assets:status")))
        error = status.get("error") or None
        error_at = status.get("error_at") if error else None
        if raw is None:
            return AssetsCache(None, [], error, error_at)
        doc = json.loads(raw)
        return AssetsCache(doc["fetched_at"], ASSETS.validate_python(doc["assets"]), error, error_at)

    # ------------------------------------------------------------------ price book and budgets

    async def pricebook_applied_at(self) -> str | None:
        return _opt(await self.redis.hget(self._k("pricebook"), "applied_at"))

    async def budgets(self) -> list[Budget]:
        raw = await self.redis.get(self._k("budgets"))
        return _budgets.validate_json(raw) if raw else []

    async def save_budgets(self, budgets: list[Budget]) -> None:
        await self.redis.set(self._k("budgets"), _budgets.dump_json(budgets))

    async def stage_alerts(self, due: list[tuple[str, Envelope]]) -> list[str]:
        """Stage in the outbox each (subject, event) not fired before, once across replicas; their ids."""
        key = self._k("budget:fired")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                # WATCH: two replicas checking at once stage each alert once.
                await pipe.watch(key)
                fired = {_s(m) for m in await pipe.smembers(key)}
                new = [(subject, env) for subject, env in due if env.id not in fired]
                if not new:
                    return []
                pipe.multi()
                pipe.sadd(key, *[env.id for _, env in new])
                for subject, env in new:
                    self.outbox.stage(pipe, subject, env)
                await pipe.execute()
        except WatchError:
            return []
        return [env.id for _, env in new]
