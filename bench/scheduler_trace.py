#!/usr/bin/env python3
"""Benchmark: trace replays under backfill and whaleflux, side by side, overall and per class of job.

Workloads (each replayed under every policy, decisions carried out with the
live executor's rules, see services/scheduler/simulator/rules.py):

- `philly-sN`: the bundled Philly trace prepared as `whaleflux trace prepare
  --seed N --time-scale 2` does, on shared/data/fleets/mixed-256.yaml (seed 1
  is the benchmark workload);
- `philly-s1-noisy`: seed 1 with runtime estimates off by a log-normal
  factor (sigma 1: a quarter of the jobs say less than half or more than
  twice their runtime);
- `synth-s1`: the synthetic trace of bench/synth_trace.py (seed 1) on
  bench/data/scarce-h200-176.yaml, where jobs above 80 GB share 16 H200s.

For each: the policies side by side, the targets of issue 14, and a table per
class (GPU count, memory tier, priority, team, workload, duration) with jobs,
mean JCT and mean/p99/max wait under both policies; `WORSE` marks a class the
default policy serves worse than backfill. Prints the machine's load average,
since replay times depend on it.

    python bench/scheduler_trace.py [--workloads philly-s1,...] [--policies backfill,whaleflux] [--workers 2]
                                    [--executor live|shortcuts]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_trace import generate  # noqa: E402  (a sibling script)

from whaleflux import traces  # noqa: E402
from whaleflux.scheduler.simulator import LIVE, ExecutorRules, SimReport  # noqa: E402
from whaleflux.scheduler.simulator.classes import ClassRow, class_rows, table  # noqa: E402
from whaleflux.scheduler.simulator.metrics import side_by_side  # noqa: E402
from whaleflux.scheduler.simulator.run import simulate_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "shared/data/fleets/mixed-256.yaml"
SCARCE = ROOT / "bench/data/scarce-h200-176.yaml"
DEFAULT = "philly-s1,philly-s2,philly-s3,philly-s1-noisy,synth-s1"
SHORTCUTS = ExecutorRules(split_jobs_that_fit_one_node=True, move_any_job=True, stop_s=0.0)


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: Path
    fleet: Path
    noise: float = 0.0
    rules: ExecutorRules = LIVE


def prepare(name: str, tmp: Path) -> Workload:
    """Write the workload's job CSV into `tmp`."""
    out = tmp / f"{name}.csv"
    if name.startswith("philly-s"):
        seed = int(name.removeprefix("philly-s").split("-")[0])
        traces.write_csv(traces.prepare(traces.read_trace(traces.PHILLY, "philly"), seed, 2.0), out)
        return Workload(name, out, MIXED, 1.0 if name.endswith("-noisy") else 0.0)
    if name.startswith("synth-s"):
        seed = int(name.removeprefix("synth-s"))
        traces.write_csv(traces.prepare(generate(seed), seed, 1.0), out)
        return Workload(name, out, SCARCE)
    raise SystemExit(f"unknown workload {name}; choose from philly-sN, philly-sN-noisy, synth-sN")


def _run(args: tuple[Workload, str]) -> tuple[SimReport, float]:
    w, policy = args
    t = time.perf_counter()
    (report,) = simulate_files(w.jobs, w.fleet, [policy], estimate_noise=w.noise, rules=w.rules)
    return report, time.perf_counter() - t


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def targets(wf: SimReport, bf: SimReport, rows: list[ClassRow]) -> str:
    """The issue's targets for one workload, each with its verdict."""
    ratio = wf.mean_jct_s / bf.mean_jct_s if bf.mean_jct_s else 0.0
    worse = [f"{r.dimension} {r.value}" for r in rows if r.worse]
    return (
        f"targets: mean JCT whaleflux/backfill = {ratio:.2f} (<= 0.50, bar 0.60: "
        f"{'met' if ratio <= 0.5 else 'bar met' if ratio <= 0.6 else 'NOT met'}); "
        f"p99 JCT {wf.p99_jct_s / 3600:.1f} h vs {bf.p99_jct_s / 3600:.1f} h "
        f"({'met' if wf.p99_jct_s <= bf.p99_jct_s else 'NOT met'}); "
        f"busy utilization, usable GPUs {wf.busy_utilization_usable:.3f} "
        f"({'met' if wf.busy_utilization_usable >= 0.93 else 'NOT met'} >= 0.93); "
        f"classes worse than backfill: {len(worse)} of {len(rows)}" + (f" ({', '.join(worse)})" if worse else "")
    )


def report(w: Workload, results: list[tuple[SimReport, float]]) -> str:
    """Print one workload's tables; returns its targets line."""
    reports = [r for r, _ in results]
    noise = f", estimate noise sigma {w.noise:g}" if w.noise else ""
    print(f"\n## {w.name}: {w.jobs.name} on {w.fleet.stem}{noise}")
    _print_table(side_by_side(reports) + [["simulation wall time (s)", *(f"{s:.1f}" for _, s in results)]])
    by = {r.policy: r for r in reports}
    if "backfill" not in by or "whaleflux" not in by:
        return ""
    rows = class_rows(by["backfill"], by["whaleflux"])
    line = targets(by["whaleflux"], by["backfill"], rows)
    print(line)
    print(f"\n### {w.name}: per class (hours; wait = first start - submit)")
    _print_table(table(rows, "backfill", "whaleflux"))
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workloads", default=DEFAULT)
    ap.add_argument("--policies", default="backfill,whaleflux")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--executor", choices=("live", "shortcuts"), default="live",
                    help="shortcuts: the old simulator's (split jobs that fit one node, move any job, no hold)")
    args = ap.parse_args()
    rules = LIVE if args.executor == "live" else SHORTCUTS
    policies = args.policies.split(",")
    began = time.perf_counter()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    lines = []
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.workers) as pool:
        loads = [replace(prepare(name, Path(tmp)), rules=rules) for name in args.workloads.split(",")]
        futures = [[pool.submit(_run, (w, p)) for p in policies] for w in loads]
        for w, fs in zip(loads, futures, strict=True):
            lines.append((w.name, report(w, [f.result() for f in fs])))
    print("\n## Summary")
    for name, line in lines:
        print(f"{name}: {line}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"whole run {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
