#!/usr/bin/env python3
"""A synthetic GPU-cluster trace, seeded: a second workload for bench/scheduler_trace.py (issue 14).

Shaped after what published analyses of production GPU clusters other than
Philly report (Helios, Hu et al., SC'21; Alibaba PAI, Weng et al., NSDI'22):
most jobs use one GPU and run minutes, a few use 8-64 GPUs, durations are
heavy-tailed (log-normal, median 15 min, capped at 5 days), and submissions
follow a day/night cycle. No real job is in it; the same seed always gives
the same trace. Written in the generic format (`job_id,submission_time,
duration,num_gpu`) that `whaleflux trace prepare --format generic` reads,
which then fills in class, memory and priority as for Philly.

    python bench/synth_trace.py -o trace.csv [--seed 1] [--jobs 30000] [--days 45]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from pathlib import Path

from whaleflux.traces import TraceJob

GPU_COUNTS = ((1, 0.74), (2, 0.07), (4, 0.08), (8, 0.08), (16, 0.02), (32, 0.007), (64, 0.003))
MEDIAN_S, SIGMA, MAX_S = 900.0, 2.0, 5 * 86400.0


def generate(seed: int = 1, jobs: int = 30_000, days: float = 45.0) -> list[TraceJob]:
    """`jobs` jobs over `days` days: day/night arrivals, heavy-tailed durations, mostly one GPU."""
    rng = random.Random(seed)
    span = days * 86400.0
    out, t, n = [], 0.0, 0
    rate = jobs / span  # mean arrivals per second; thinned by the day/night cycle below
    while n < jobs:
        t += rng.expovariate(2 * rate)
        if rng.random() > 0.5 * (1 + 0.6 * math.sin(2 * math.pi * (t / 86400.0 - 0.25))):
            continue  # nights and early mornings are quieter
        gpus = rng.choices([g for g, _ in GPU_COUNTS], [w for _, w in GPU_COUNTS])[0]
        duration = min(MAX_S, max(60.0, rng.lognormvariate(math.log(MEDIAN_S) + 0.3 * math.log(gpus), SIGMA)))
        out.append(TraceJob(f"synth-{n:06d}", t, round(duration), gpus, None))
        n += 1
    return out


def write_generic(jobs: list[TraceJob], path: Path) -> None:
    """The generic trace CSV."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submission_time", "duration", "num_gpu"])
        w.writerows([j.job_id, f"{j.submit_s:.0f}", f"{j.duration_s:.0f}", j.gpus] for j in jobs)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=30_000)
    ap.add_argument("--days", type=float, default=45.0)
    args = ap.parse_args()
    write_generic(generate(args.seed, args.jobs, args.days), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
