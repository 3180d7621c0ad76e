#!/usr/bin/env python3
"""Benchmark: billing's ledger ingest and a chargeback over 1,000,000 allocation intervals.

Two figures, both on the pure core (no Redis, no NATS):

1. ledger ingest: job events (placed, started, finished as CloudEvents JSON)
   decoded and validated (`events.decode`) and turned into ledger records
   by billing's decision module (`ledger.job_event`), per second;
2. a report over 1,000,000 per-GPU allocation intervals on a 512-GPU fleet
   (owned, leased, cloud; two months, so month boundaries and a price change
   split the rate segments), from what the store holds for it (the report rows
   of 250,000 attempts of 4 GPUs, `usage.row`, as Redis hands them over) to
   the totals: the rows decoded into columns (`UsageColumns.decode`), the
   intervals and the overlap cut on columns (`costing.charged_intervals`),
   `allocation.chargeback` and `showback` by team, without and with idle
   shared back. Printed beside the same run's references: one bare Python pass
   over the records as objects, one `json.loads` of the rows, and the path
   before (each stored record parsed by pydantic, then the same columns).

    python bench/billing_ledger.py [--jobs 20000] [--intervals 1000000] [--gpus 512] [--seed 1] [--redis 3]

With `--redis N`, then N times the same report with its rows read from a local
Redis through billing's store by the time index (the records written by
`commit_view` first): what a report costs from Redis to the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from telemetry_harness import server_env, start_servers

from whaleflux.billing import ledger
from whaleflux.billing.allocation import chargeback, showback
from whaleflux.billing.app import BillingSettings, build
from whaleflux.billing.costing import charged_intervals
from whaleflux.billing.ledger import LedgerView
from whaleflux.billing.metering import UsageRecord
from whaleflux.billing.ownership import GpuTerms, gpu_cost, to_ms
from whaleflux.billing.pricebook import parse_pricebook
from whaleflux.billing.usage import UsageColumns, no_gc, row
from whaleflux.shared.contracts import Holder, JobHolds, gpus_involved
from whaleflux.shared.events import JobFinished, JobPlaced, JobStarted, decode, encode, make_envelope
from whaleflux.shared.logs import configure_logging

START = datetime(2026, 3, 1, tzinfo=UTC)
END = datetime(2026, 5, 1, tzinfo=UTC)
BOOK = """\
prices:
  - {model: H100, ownership: owned, effective_from: 2026-01-01, effective_until: 2026-03-31, usd_per_kwh: "0.12",
     overhead_per_gpu_month: "150"}
  - {model: H100, ownership: owned, effective_from: 2026-04-01, usd_per_kwh: "0.14", overhead_per_gpu_month: "160"}
"""


def job_events(n: int, rng: random.Random) -> list[bytes]:
    out = []
    for i in range(n):
        job = f"bench-{i}"
        gpus = [f"GPU-{rng.randrange(512)}" for _ in range(rng.choice([1, 1, 2, 4, 8]))]
        t = START + timedelta(seconds=rng.randrange(0, 86400 * 50))
        placed = JobPlaced(job_id=job, attempt=1, cluster="c", node="n1", gpu_model="H100", gpu_uuids=gpus,
                           gpu_indices=list(range(len(gpus))), command=["x"], team="t", project="p")
        started = JobStarted(job_id=job, attempt=1, cluster="c", node="n1", gpu_uuids=gpus, pid=1, started_at=t)
        finished = JobFinished(job_id=job, attempt=1, cluster="c", node="n1", exit_code=0, started_at=t,
                               finished_at=t + timedelta(seconds=rng.randrange(60, 36000)))
        for data in (placed, started, finished):
            out.append(encode(make_envelope(data, source="bench", time=t)))
    return out


def ingest(raw: list[bytes]) -> dict[str, UsageRecord]:
    """The handler's work without Redis: decode, validate, then billing's decision (`ledger.job_event`: the
    GPU-holder fold, the placement, the usage records), its outcome kept in memory as the store would."""
    holds: dict[str, JobHolds] = {}
    holders: dict[str, Holder] = {}
    placements: dict[str, JobPlaced] = {}
    usage: dict[str, UsageRecord] = {}
    for msg in raw:
        env, data = decode(msg)
        job_id = getattr(data, "job_id", "")
        job = holds.get(job_id, JobHolds())
        keys = [s.ledger for s in ledger.spans(data, env.time)]
        state = ledger.JobEventState(job, {g: holders.get(g) for g in gpus_involved(job, data)},
                                     {k: usage.get(k) for k in keys}, {k: placements.get(k) for k in keys})
        outcome = ledger.job_event(data, env.time, state)
        assert outcome.missing is None, outcome.missing
        holds[job_id] = outcome.holders.job
        for g in outcome.holders.release:
            holders.pop(g, None)
        holders.update(outcome.holders.hold)
        usage.update((r.ledger_key, r) for r in outcome.records)
        if outcome.placement is not None:
            placements[outcome.placement[0]] = outcome.placement[1]
    return usage


def fleet(n: int):
    book = parse_pricebook(BOOK)
    gpus = {}
    for i in range(n):
        kind = (i // 8) % 4  # 8-GPU nodes: a job's GPUs share a node and its terms
        if kind == 0:
            t = GpuTerms(uuid=f"GPU-{i}", model="H200", ownership="leased", pool="cloud", lease_monthly=Decimal("2150"),
                         lease_start=date(2026, 1, 1), lease_end=date(2026, 12, 31))
        elif kind == 3:
            t = GpuTerms(uuid=f"GPU-{i}", model="A100", ownership="cloud", pool="burst", in_fleet_since=START)
        else:
            t = GpuTerms(uuid=f"GPU-{i}", model="H100", ownership="owned", pool="onprem",
                         purchase_price=Decimal("30000"), purchase_date=date(2025, 3, 1),
                         depreciation_months=48)
        gpus[t.uuid] = gpu_cost(t, book, START, END)
    return gpus


def ledger_records(n: int, gpus: int, rng: random.Random) -> list[UsageRecord]:
    """Ledger records holding `n` GPU intervals in all: four GPUs of one node per attempt, never two attempts at
    once on one GPU, spread over the two months."""
    out: list[dict[str, Any]] = []
    lo = START
    per_gpu = n // gpus
    slot = (END - START) / per_gpu
    for k in range(per_gpu * (gpus // 4)):
        quad, j = divmod(k, per_gpu)
        s = lo + j * slot + timedelta(milliseconds=rng.randrange(0, int(slot.total_seconds() * 250)))
        held = timedelta(milliseconds=rng.randrange(int(slot.total_seconds() * 250), int(slot.total_seconds() * 750)))
        out.append(dict(
            job_id=f"j{k}", attempt=1, team=f"team{rng.randrange(40)}", project=f"proj{rng.randrange(200)}",
            gpu_model="H100", gpus=4, node=f"n{quad // 2}", cluster="c",
            gpu_uuids=[f"GPU-{4 * quad + i}" for i in range(4)], started_at=s, ended_at=s + held, state="finished",
            gpu_seconds=Decimal(4 * int(held.total_seconds())), rank=0, nodes=[]))
    rng.shuffle(out)  # in no order, each record made in list order as a report's read parses them
    return [UsageRecord.model_construct(**r) for r in out]


async def through_redis(records: list[UsageRecord], gpus: dict[str, Any], repeat: int) -> None:
    """The same report with its rows read from billing's Redis by the time index (`BillingStore.usage_columns`),
    the records written by the store's own `commit_view`."""
    _, svc = build(BillingSettings(inventory_url="http://127.0.0.1:9"), clock=lambda: END)
    await svc.runtime.start()
    try:
        for i in range(0, len(records), 5000):
            chunk = records[i:i + 5000]
            await svc.store.commit_view(LedgerView(usage={r.ledger_key: r for r in chunk},
                                                   dirty_usage={r.ledger_key for r in chunk}))
        lo, hi = to_ms(START), to_ms(END)
        for _ in range(repeat):
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            window = await svc.store.usage_columns(START, END)
            dt_read = time.perf_counter() - t
            charged = charged_intervals(window, END)
            sb = showback(chargeback(charged.table, charged.jobs, gpus, lo, hi), "team", share_idle=True)
            dt, cpu = time.perf_counter() - t, time.process_time() - c
            print(f"through Redis: the window's {len(window):,} rows read by the time index and decoded "
                  f"(BillingStore.usage_columns) {dt_read:.2f} s + columns, chargeback, showback with idle shared "
                  f"back {dt - dt_read:.2f} s = {dt:.2f} s, this process's CPU {cpu:.2f} s (fleet "
                  f"${sb.fleet_usd:,}, idle ${sb.idle_usd:,})")
            del window, charged, sb
    finally:
        await svc.runtime.stop()


def redis_run(records: list[UsageRecord], gpus: dict[str, Any], repeat: int) -> None:
    servers = start_servers()
    os.environ.update(server_env(servers))  # the in-process service reads them
    configure_logging("billing", "warning")
    try:
        asyncio.run(through_redis(records, gpus, repeat))
    finally:
        servers.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--intervals", type=int, default=1_000_000)
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--redis", type=int, default=0, metavar="N",
                    help="then N reports with the rows read from a local Redis (starts redis-server, nats-server)")
    a = ap.parse_args()
    rng = random.Random(a.seed)

    raw = job_events(a.jobs, rng)
    t = time.perf_counter()
    usage = ingest(raw)
    dt = time.perf_counter() - t
    print(f"ledger ingest: {len(raw):,} job events in {dt:.2f} s = {len(raw) / dt:,.0f} events/s "
          f"({len(usage):,} records)")

    gpus = fleet(a.gpus)
    records = ledger_records(a.intervals, a.gpus, rng)
    stored = [row(r) for r in records]  # what the store holds for reports (`usage:rows`), as HMGET returns it
    jsons = [r.model_dump_json() for r in records]  # the records themselves (`usage`): what reports parsed before
    lo, hi = to_ms(START), to_ms(END)
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    n_gpus = sum(len(r.gpu_uuids) for r in records if r.ended_at is not None and r.started_at < r.ended_at)
    ref, ref_cpu = time.perf_counter() - t, time.process_time() - c
    t = time.perf_counter()
    n_rows = len(json.loads("[" + ",".join(stored) + "]"))
    ref_json = time.perf_counter() - t
    t = time.perf_counter()
    with no_gc():
        parsed = [UsageRecord.model_validate_json(v) for v in jsons]
    dt_parse = time.perf_counter() - t
    charged = charged_intervals(UsageColumns.of(parsed), END)
    showback(chargeback(charged.table, charged.jobs, gpus, lo, hi), "team", share_idle=True)
    dt_before = time.perf_counter() - t
    print(f"reference, same run: one bare pass over the {len(records):,} ledger records (objects) reading their times "
          f"and GPUs ({n_gpus:,}) in {ref:.2f} s (CPU {ref_cpu:.2f} s); one json.loads of the {n_rows:,} stored "
          f"report rows ({sum(map(len, stored)) / 1e6:.1f} MB) in {ref_json:.2f} s; before (each stored record "
          f"parsed by pydantic, as reports did) {dt_parse:.2f} s to parse, {dt_before:.2f} s in all (shared)")
    del parsed, charged
    gc.collect()
    for share in (False, True):
        t, c = time.perf_counter(), time.process_time()
        window = UsageColumns.decode(stored).overlapping(lo, hi)
        dt_decode = time.perf_counter() - t
        table, jobs, overlaps = charged_intervals(window, END)
        dt_cols = time.perf_counter() - t - dt_decode
        cb = chargeback(table, jobs, gpus, lo, hi)
        sb = showback(cb, "team", share_idle=share)
        dt, cpu = time.perf_counter() - t, time.process_time() - c
        print(f"report from the {len(stored):,} stored report rows: decode (UsageColumns.decode) {dt_decode:.2f} s + "
              f"columns and overlap cut (costing.charged_intervals) {dt_cols:.2f} s + chargeback + showback by team"
              f"{' with idle shared back' if share else ''} {dt - dt_decode - dt_cols:.2f} s: "
              f"{len(table):,} intervals, {len(jobs):,} jobs, {a.gpus} GPUs, 2 months, {len(overlaps)} overlaps, "
              f"in {dt:.2f} s, CPU {cpu:.2f} s (fleet ${sb.fleet_usd:,}, "
              f"allocated ${cb.allocated_usd.quantize(sb.fleet_usd):,}, idle ${sb.idle_usd:,}); "
              f"{dt / ref:.2f}x the bare pass over the records ({cpu / ref_cpu:.2f}x its CPU)")
        del window, table, jobs, cb, sb
        gc.collect()
    if a.redis:
        redis_run(records, gpus, a.redis)


if __name__ == "__main__":
    main()
