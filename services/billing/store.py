"""Billing's Redis state: every key and encoding it keeps under `wf:billing`, behind typed methods.

Nothing else in billing talks to Redis. The keys (docs/services/billing.md):
`alloc:<ledger>` (the `job.placed` data), `usage` (ledger -> usage record),
`holds` and `gpu:holder` (the GPU-holder fold: job -> its holds, GPU -> the
part holding it), `usage:rows` (ledger -> its report row), `usage:starts`, `usage:running`,
`usage:longest` (the ledger's time index),
`energy:last`, `energy:series:<gpu>`, `assets`, `assets:status`, `pricebook`,
`pricebook:error`, `budgets`, `budget:fired`, `budget:alerts`.
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

from .budgets import Budget, Firing
from .energy import Reading, Series
from .ledger import LedgerView
from .metering import UsageRecord
from .ownership import to_ms
from .pricebook import PriceBook, parse_pricebook
from .usage import UsageColumns, row

HOUR_MS = 3_600_000
# The report rows of a window, joined by commas into one reply (one string for the client to parse, not one
# reply per record): the records starting in [lo - the longest ended record, hi) by start (ties by key), then
# the running ones not among them, sorted. KEYS: usage:starts, usage:running, usage:longest, usage:rows.
_WINDOW = """
local back = tonumber(redis.call('ZSCORE', KEYS[3], 'ms') or 0)
local keys = redis.call('ZRANGEBYSCORE', KEYS[1], tonumber(ARGV[1]) - back, '(' .. ARGV[2])
local seen = {}
for _, k in ipairs(keys) do seen[k] = true end
local running = redis.call('SMEMBERS', KEYS[2])
table.sort(running)
for _, k in ipairs(running) do
  if not seen[k] then keys[#keys + 1] = k end
end
local out = {}
for i = 1, #keys, 1000 do
  local rows = redis.call('HMGET', KEYS[4], unpack(keys, i, math.min(i + 999, #keys)))
  for _, r in ipairs(rows) do
    if r then out[#out + 1] = r end
  end
end
return table.concat(out, ',')
"""
# What a batch of job events reads (`ledger_view`), as one JSON reply (one string for the client to parse, not
# one reply per value: most are nil, a new job's). KEYS: holds, usage, gpu:holder, then alloc:<ledger> per
# ledger; ARGV: the number of jobs, the jobs, the ledgers, the GPUs. [holds, usage, placements, holders], a
# missing value false; cjson writes an empty list as {}.
_LEDGER_VIEW = """
local jobs = tonumber(ARGV[1])
local ledgers = #KEYS - 3
local function hmget(key, first, last)
  local out = {}
  for i = first, last, 1000 do
    for _, v in ipairs(redis.call('HMGET', key, unpack(ARGV, i, math.min(i + 999, last)))) do out[#out + 1] = v end
  end
  return out
end
local placed = {}
for i = 4, #KEYS, 1000 do
  for _, v in ipairs(redis.call('MGET', unpack(KEYS, i, math.min(i + 999, #KEYS)))) do placed[#placed + 1] = v end
end
return cjson.encode({hmget(KEYS[1], 2, jobs + 1), hmget(KEYS[2], jobs + 2, jobs + ledgers + 1), placed,
                     hmget(KEYS[3], jobs + ledgers + 2, #ARGV)})
"""
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

    async def ledger_view(self, jobs: Sequence[str], gpus: Sequence[str], ledgers: Sequence[str]) -> LedgerView:
        """What a batch of job events depends on, in one round trip (two when the jobs hold GPUs the events do
        not name): the jobs' holds, the holders of `gpus` and of the jobs' GPUs, the usage record and
        placement of each of `ledgers`."""
        keys = [self._k("holds"), self._k("usage"), self._k("gpu:holder"), *(self._k(f"alloc:{k}") for k in ledgers)]
        reply = await self.redis.eval(_LEDGER_VIEW, len(keys), *keys, len(jobs), *jobs, *ledgers, *gpus)
        raw_holds, raw_usage, raw_placed, raw_holders = (v or () for v in json.loads(reply))  # {}: an empty list
        view = LedgerView()
        view.holds = {j: JobHolds.decode(h) for j, h in zip(jobs, raw_holds, strict=True) if h}
        view.holders = {g: Holder.decode(h) if h else None for g, h in zip(gpus, raw_holders, strict=True)}
        missing = sorted({g for h in view.holds.values() for g in h.gpus()} - set(view.holders))
        view.holders.update(zip(missing, await self.holders(missing), strict=True))
        view.unheld = frozenset(g for g, h in view.holders.items() if h is None)
        view.usage = {k: UsageRecord.model_validate_json(u) if u else None
                      for k, u in zip(ledgers, raw_usage, strict=True)}
        view.placements = {k: JobPlaced.model_validate_json(p) if p else None
                           for k, p in zip(ledgers, raw_placed, strict=True)}
        return view

    async def commit_view(self, view: LedgerView) -> None:
        """Write what a batch of job events changed in one transaction: the fold, usage records, placements."""
        held = [(g, h) for g in view.dirty_holders if (h := view.holders.get(g)) is not None]
        # A GPU held and released within the batch (placed and finished) had no holder stored: nothing to clear.
        released = [g for g in view.dirty_holders if view.holders.get(g) is None and g not in view.unheld]
        usage = [r for k in view.dirty_usage if (r := view.usage.get(k)) is not None]
        async with self.redis.pipeline(transaction=True) as pipe:
            if view.dirty_holds:
                pipe.hset(self._k("holds"), mapping={j: view.holds[j].encode() for j in view.dirty_holds})
            if held:
                pipe.hset(self._k("gpu:holder"), mapping={g: h.encode() for g, h in held})
            if released:
                pipe.hdel(self._k("gpu:holder"), *released)
            if usage:
                pipe.hset(self._k("usage"), mapping={r.ledger_key: r.model_dump_json() for r in usage})
                self._index_usage(pipe, usage)
            placed = {self._k(f"alloc:{k}"): p.model_dump_json() for k in view.dirty_placements
                      if (p := view.placements.get(k)) is not None}
            if placed:
                pipe.mset(placed)
            await pipe.execute()

    def _index_usage(self, pipe: Any, records: Sequence[UsageRecord]) -> None:
        """Each record's report row (`usage:rows`, what reports read), and the time index: `usage:starts`
        (ledger key by start ms), `usage:running` (not ended), `usage:longest` (the longest ended record's ms,
        only ever raised)."""
        pipe.hset(self._k("usage:rows"), mapping={r.ledger_key: row(r) for r in records})
        self._index_times(pipe, records)

    def _index_times(self, pipe: Any, records: Sequence[UsageRecord]) -> None:
        pipe.zadd(self._k("usage:starts"), {r.ledger_key: to_ms(r.started_at) for r in records})
        running = [r.ledger_key for r in records if r.ended_at is None]
        ended = [r for r in records if r.ended_at is not None]
        if running:
            pipe.sadd(self._k("usage:running"), *running)
        if ended:
            pipe.srem(self._k("usage:running"), *[r.ledger_key for r in ended])
            longest = max(to_ms(r.ended_at) - to_ms(r.started_at) for r in ended if r.ended_at is not None)
            pipe.zadd(self._k("usage:longest"), {"ms": longest}, gt=True)

    async def ensure_usage_index(self) -> int:
        """Index a ledger written before the time index or the report rows (once, at start-up); how many
        records were indexed. A row already there is newer than this read: kept (HSETNX)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hlen(self._k("usage"))
            pipe.zcard(self._k("usage:starts"))
            pipe.hlen(self._k("usage:rows"))
            count, indexed, rows = await pipe.execute()
        if count <= min(indexed, rows):
            return 0
        records = [UsageRecord.model_validate_json(v) for v in (await self.redis.hgetall(self._k("usage"))).values()]
        async with self.redis.pipeline(transaction=True) as pipe:
            for r in records:
                pipe.hsetnx(self._k("usage:rows"), r.ledger_key, row(r))
            self._index_times(pipe, records)
            await pipe.execute()
        return len(records)

    async def usage_columns(self, start: datetime, end: datetime) -> UsageColumns:
        """The records (one per attempt, per part of a gang) whose allocation overlaps [start, end), as columns
        of their report rows: read by the time index, so a report costs what its window holds, not the whole
        history."""
        lo, hi = to_ms(start), to_ms(end)
        joined = await self.redis.eval(_WINDOW, 4, self._k("usage:starts"), self._k("usage:running"),
                                       self._k("usage:longest"), self._k("usage:rows"), lo, hi)
        return UsageColumns.decode_joined(_s(joined)).overlapping(lo, hi)

    async def all_usage_records(self) -> list[UsageRecord]:
        """Every record of the ledger (tests and tools; reports read by window)."""
        raw = await self.redis.hgetall(self._k("usage"))
        return [UsageRecord.model_validate_json(v) for v in raw.values()]

    async def job_usage(self, job_id: str) -> list[UsageRecord]:
        """The records of one job's attempts (every part of a gang), found without reading the others."""
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in job_id) + ":*"
        out = []
        async for key, value in self.redis.hscan_iter(self._k("usage"), match=pattern, count=1000):
            if _s(key).rsplit(":", 1)[0] == job_id:
                out.append(UsageRecord.model_validate_json(value))
        return out

    async def holders(self, gpus: Sequence[str]) -> list[Holder | None]:
        """The part of an attempt holding each GPU (the shared GPU-holder fold), or None."""
        if not gpus:
            return []
        return [_holder(h) for h in await self.redis.hmget(self._k("gpu:holder"), list(gpus))]

    # ------------------------------------------------------------------ energy and utilization

    async def last_readings(self, gpus: Sequence[str]) -> list[Reading | None]:
        """Each GPU's last sample (`energy:last`, `Reading.encode`), or None."""
        raw = await self.redis.hmget(self._k("energy:last"), list(gpus))
        return [Reading.decode(_s(r)) if r else None for r in raw]

    async def add_readings(self, readings: dict[str, Reading], lasts: dict[str, Reading | None]) -> None:
        """Keep one batch's new readings: the last per GPU and each GPU's time series (`energy:series:<gpu>`,
        scored by sample ms), trimmed to the retention once an hour per GPU; one round trip."""
        if not readings:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._k("energy:last"), mapping={g: r.encode() for g, r in readings.items()})
            for gpu, r in readings.items():
                key = self._k(f"energy:series:{gpu}")
                pipe.zadd(key, {r.encode(): r.t_ms})
                last = lasts.get(gpu)
                if last is None or last.t_ms // HOUR_MS != r.t_ms // HOUR_MS:
                    pipe.zremrangebyscore(key, "-inf", f"({r.t_ms - self.energy_ttl_s * 1000}")
            await pipe.execute()

    async def series(self, points: dict[str, set[int]]) -> Series:
        """The samples of each GPU around each of its `points`: the whole stretch between its first and last
        point when that holds few samples per point, else the neighbours of each point; two round trips."""
        gpus = [g for g, ts in points.items() if ts]
        if not gpus:
            return Series({})
        async with self.redis.pipeline(transaction=False) as pipe:
            for g in gpus:
                pipe.zcount(self._k(f"energy:series:{g}"), min(points[g]), max(points[g]))
            counts = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for g, n in zip(gpus, counts, strict=True):
                key, ts = self._k(f"energy:series:{g}"), sorted(points[g])
                if n <= 2 * len(ts):
                    pipe.zrangebyscore(key, ts[0], ts[-1])
                    ts = [ts[0], ts[-1]]
                for t in ts:
                    pipe.zrevrangebyscore(key, t, "-inf", start=0, num=1)
                    pipe.zrangebyscore(key, t, "+inf", start=0, num=1)
            found = await pipe.execute()
        by_gpu: dict[str, dict[int, Reading]] = defaultdict(dict)
        replies = iter(found)
        for g, n in zip(gpus, counts, strict=True):
            queries = (1 + 2 * 2) if n <= 2 * len(points[g]) else 2 * len(points[g])
            for _ in range(queries):
                for member in next(replies):
                    r = Reading.decode(_s(member))
                    by_gpu[g][r.t_ms] = r
        return Series({g: list(rs.values()) for g, rs in by_gpu.items()})

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

    async def budget_alerts(self) -> dict[str, Firing]:
        """Fingerprint -> the cost alert billing raised under it (firing or resolved)."""
        raw = await self.redis.hgetall(self._k("budget:alerts"))
        return {_s(fp): Firing.model_validate_json(v) for fp, v in raw.items()}

    async def stage_alerts(self, due: list[tuple[str, Envelope, str, Firing]]) -> list[str]:
        """Stage in the outbox each (subject, event) not published before, with its fingerprint's state after
        it, once across replicas; their ids."""
        key, states = self._k("budget:fired"), self._k("budget:alerts")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                # WATCH: two replicas checking at once stage each event once.
                await pipe.watch(key, states)
                fired = {_s(m) for m in await pipe.smembers(key)}
                new = [(subject, env, fp, state) for subject, env, fp, state in due if env.id not in fired]
                if not new:
                    return []
                pipe.multi()
                pipe.sadd(key, *[env.id for _, env, _, _ in new])
                pipe.hset(states, mapping={fp: state.model_dump_json() for _, _, fp, state in new})
                for subject, env, _, _ in new:
                    self.outbox.stage(pipe, subject, env)
                await pipe.execute()
        except WatchError:
            return []
        return [env.id for _, env, _, _ in new]
