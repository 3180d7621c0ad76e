#!/usr/bin/env python3
"""Benchmark: a one-day cost report over a year of history, through the real billing store (Redis).

A year of usage (`--jobs-per-day` finished attempts a day on a 64-GPU fleet,
plus a few long and running ones) is written into billing's Redis keys with
the service's own store; then `Billing.compute` for one day (the time index,
the window's records, samples, chargeback) and `costs_report` are timed, the
best of `--repeat`. Printed beside the same run's reference: reading and
parsing the whole ledger (`all_usage_records`, what every report did before the
time index). Starts its own redis-server and nats-server.

    python bench/billing_report.py [--jobs-per-day 30] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime, timedelta

from telemetry_harness import server_env, start_servers

from whaleflux.billing.app import BillingSettings, build
from whaleflux.billing.ledger import LedgerView
from whaleflux.billing.metering import UsageRecord
from whaleflux.billing.report import costs_report
from whaleflux.shared.logs import configure_logging

TARGET_MS = 50
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def history(per_day: int) -> list[UsageRecord]:
    out = []
    for d in range(365):
        day = NOW - timedelta(days=d + 1)
        for j in range(per_day):
            start = day + timedelta(minutes=j * 40)
            gpus = [f"GPU-{(d * per_day + j) % 64:02d}"]
            out.append(UsageRecord(job_id=f"j{d:03d}-{j:03d}", attempt=1, team=f"t{j % 8}", project=f"p{j % 5}",
                                   gpu_model="H100", gpus=1, node="n", gpu_uuids=gpus, started_at=start,
                                   ended_at=start + timedelta(minutes=35), state="finished"))
    out.append(UsageRecord(job_id="long", attempt=1, team="t0", project="p0", gpu_model="H100", gpus=1, node="n",
                           gpu_uuids=["GPU-63"], started_at=NOW - timedelta(days=20),
                           ended_at=NOW - timedelta(days=5), state="finished"))
    return out


async def run(per_day: int, repeat: int) -> None:
    _, svc = build(BillingSettings(inventory_url="http://127.0.0.1:9"), clock=lambda: NOW)
    await svc.runtime.start()
    try:
        records = history(per_day)
        for i in range(0, len(records), 5000):
            chunk = records[i:i + 5000]
            await svc.store.commit_view(LedgerView(usage={r.ledger_key: r for r in chunk},
                                                   dirty_usage={r.ledger_key for r in chunk}))
        day = NOW - timedelta(days=3)
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            report = costs_report(await svc.compute(day, day + timedelta(days=1), NOW), "team", False)
            best = min(best, time.perf_counter() - t)
        jobs = sum(r["jobs"] for r in report["rows"])
        ref = float("inf")
        for _ in range(max(repeat // 4, 1)):
            t = time.perf_counter()
            everything = await svc.store.all_usage_records()
            ref = min(ref, time.perf_counter() - t)
    finally:
        await svc.runtime.stop()
    print(f"one-day report over a year of history ({len(records):,} attempts; {jobs} in the day): "
          f"{best * 1000:.1f} ms (best of {repeat}; target <= {TARGET_MS} ms); reference, same run: reading and "
          f"parsing the whole ledger ({len(everything):,} records) {ref * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs-per-day", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    servers = start_servers()
    os.environ.update(server_env(servers))  # the in-process service reads them
    configure_logging("billing", "warning")
    try:
        asyncio.run(run(args.jobs_per_day, args.repeat))
    finally:
        servers.stop()


if __name__ == "__main__":
    main()
