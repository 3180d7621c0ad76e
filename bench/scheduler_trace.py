#!/usr/bin/env python3
"""Benchmark: the Philly workload (seed 1) on mixed-256 under fifo, backfill and whaleflux.

Prepares the workload as `whaleflux trace prepare` does (whaleflux/traces.py;
default trace: the bundled shared/data/traces/philly.csv.xz) at time scales 2
(the benchmark workload), 1.5 and 3, replays each through the simulator and
prints the policies side by side, then the figures against the issue's targets.

    python bench/scheduler_trace.py [--trace PATH] [--format philly|generic] [--fleet PATH] [--scales 2,1.5,3] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from whaleflux import traces
from whaleflux.scheduler.simulator.metrics import side_by_side
from whaleflux.scheduler.simulator.run import simulate_files

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ["fifo", "backfill", "whaleflux"]


def _run(args: tuple[str, str, str]):
    jobs, fleet, policy = args
    t = time.perf_counter()
    (report,) = simulate_files(jobs, fleet, [policy])
    return report, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=traces.PHILLY)
    ap.add_argument("--format", choices=traces.FORMATS, default="philly")
    ap.add_argument("--fleet", default=str(ROOT / "shared/data/fleets/mixed-256.yaml"))
    ap.add_argument("--scales", default="2,1.5,3")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    trace = list(traces.read_trace(args.trace, args.format))
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.workers) as pool:
        for scale in args.scales.split(","):
            jobs = Path(tmp) / f"{args.trace.name.split('.')[0]}-s{args.seed}-x{scale}.csv"
            traces.write_csv(traces.prepare(trace, args.seed, float(scale)), jobs)
            results = list(pool.map(_run, [(str(jobs), args.fleet, p) for p in POLICIES]))
            reports = [r for r, _ in results]
            print(f"\n## {args.trace.name} seed {args.seed}, time scale {scale}, {Path(args.fleet).stem}")
            rows = side_by_side(reports) + [["simulation wall time (s)", *(f"{s:.1f}" for _, s in results)]]
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            for row in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
            by = {r.policy: r for r in reports}
            wf, bf = by["whaleflux"], by["backfill"]
            print(
                f"targets: mean JCT whaleflux/backfill = {wf.mean_jct_s / bf.mean_jct_s:.2f} (<= 0.60); "
                f"p99 JCT {wf.p99_jct_s / 3600:.1f} h vs {bf.p99_jct_s / 3600:.1f} h (no worse); "
                f"busy utilization {wf.busy_utilization:.3f} (>= 0.92; usable GPUs only {wf.busy_utilization_usable:.3f}, "
                f"literal formula {wf.busy_utilization_literal:.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
