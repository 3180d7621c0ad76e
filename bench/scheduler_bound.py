#!/usr/bin/env python3
"""Benchmark: how low mean JCT can go on a trace, from an idealized scheduler, beside backfill's replay.

The idealized scheduler is a fluid model far looser than anything a live
scheduler can do: GPUs of one model are one pool (no nodes, no packing, no
fragmentation), every job's runtime is known exactly, and at every arrival
and every end the whole fleet is handed out again from scratch, shortest
remaining work first, each job on the fastest model with enough memory and
GPUs free (shortest remaining first on the fastest machines, the classic
rule for mean response time on machines of different speeds). Stops, moves
and restarts cost nothing. Three variants:

- `free`: every job may be stopped and moved at any instant;
- `live-movable`: as the live rules allow, only jobs that keep a checkpoint
  (`SimJob.keeps_checkpoint`, one node or not) may be stopped or moved; a job
  that keeps none runs to its end where it started;
- `no-stops`: no job is stopped once started (shortest first, not shortest
  remaining first).

A job runs at its model's speed for its class (gpu_models.yaml), times the
multi-GPU efficiency of the model's interconnect, times the cross-node one
when it needs more GPUs than a node has, like the simulator's placements.
This is a reference for what the policy's mean JCT could reach, not a proof
of a bound (shortest remaining first is not optimal for jobs of several
GPUs). The same run replays backfill with the live executor's rules, the
reference the issue's ratio is taken against.

    python bench/scheduler_bound.py [--seeds 1,2,3] [--variants free,live-movable,no-stops]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from bisect import bisect_left, insort
from dataclasses import dataclass
from pathlib import Path

from whaleflux import traces
from whaleflux.scheduler.placement import NodeState
from whaleflux.scheduler.queueing import BACKFILL
from whaleflux.scheduler.simulator.engine import MIB_PER_GB, simulate
from whaleflux.scheduler.simulator.fleet import fleet_nodes, interconnects, model_facts
from whaleflux.scheduler.simulator.run import load_jobs
from whaleflux.scheduler.simulator.workload import SimJob
from whaleflux.shared.catalog import load_fleet

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "shared/data/fleets/mixed-256.yaml"


@dataclass(frozen=True)
class Pool:
    model: str
    gpus: int
    memory_gb: float
    per_node: int
    multi_gpu: float  # the efficiency of the model's interconnect for a job of several GPUs


def pools(fleet_yaml: Path) -> list[Pool]:
    """One pool per GPU model of the fleet."""
    links = interconnects()
    by_model: dict[str, list[NodeState]] = {}
    for n in fleet_nodes(load_fleet(fleet_yaml)):
        by_model.setdefault(n.model, []).append(n)
    return [Pool(model, sum(len(n.gpus) for n in ns), ns[0].gpus[0].memory_total_mib / MIB_PER_GB,
                 max(len(n.gpus) for n in ns), links.nvlink if ns[0].interconnect == "nvlink" else links.pcie)
            for model, ns in by_model.items()]


def _rate(job: SimJob, pool: Pool, speeds: dict[str, dict[str, float]], cross_node: float) -> float:
    rate = speeds[pool.model].get(job.workload_class, 1.0)
    if job.num_gpus > 1:
        rate *= pool.multi_gpu * (cross_node if job.num_gpus > pool.per_node else 1.0)
    return rate


VARIANTS = ("free", "live-movable", "no-stops")


def idealized(jobs: list[SimJob], fleet: list[Pool], variant: str, walk: int = 3000) -> float:
    """Mean JCT (s) of the fluid scheduler above (`variant`: which jobs may be stopped, one of `VARIANTS`);
    `walk`: jobs examined per hand-out (those after wait)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant}; choose from {', '.join(VARIANTS)}")
    facts = model_facts()
    speeds = {m: dict(f.speed) for m, f in facts.items()}
    cross = interconnects().cross_node
    # Each job's models, fastest first, with its rate on each; a gang larger than any one model's pool spans
    # the models with enough memory at the slowest one's rate, across nodes.
    options: dict[int, list[tuple[tuple[int, ...], float]]] = {}
    for i, j in enumerate(jobs):
        roomy = [k for k, p in enumerate(fleet) if p.memory_gb >= j.min_vram_gb]
        fit: list[tuple[tuple[int, ...], float]] = [
            ((k,), _rate(j, fleet[k], speeds, cross)) for k in roomy if fleet[k].gpus >= j.num_gpus]
        if not fit and sum(fleet[k].gpus for k in roomy) >= j.num_gpus:
            fit = [(tuple(roomy), min(_rate(j, fleet[k], speeds, cross) for k in roomy) * cross)]
        if not fit:
            raise ValueError(f"{j.job_id}: the fleet cannot hold it")
        options[i] = sorted(fit, key=lambda o: -o[1])
    left = [float(j.duration_s) for j in jobs]  # A100 seconds of work left
    waiting: list[tuple[float, int]] = []  # sorted (work left, index): its work left does not change while it waits
    running: dict[int, tuple[float, list[int]]] = {}  # index -> (rate, GPUs it holds of each pool)
    pinned = [False] * len(jobs)  # started and may not be stopped (`variant`): runs to its end where it is
    now, nxt, total_jct, done = 0.0, 0, 0.0, 0
    while done < len(jobs):
        end_at, ending = float("inf"), -1
        for i, (rate, _) in running.items():
            t = now + left[i] / rate
            if t < end_at:
                end_at, ending = t, i
        arrive_at = jobs[nxt].submit_time_s if nxt < len(jobs) else float("inf")
        t = min(end_at, arrive_at)
        for i, (rate, _) in running.items():
            left[i] -= rate * (t - now)
        now = t
        if end_at <= arrive_at:
            del running[ending]
            total_jct += now - jobs[ending].submit_time_s
            done += 1
        while nxt < len(jobs) and jobs[nxt].submit_time_s <= now:
            insort(waiting, (left[nxt], nxt))
            nxt += 1
        # Hand the fleet out again: pinned jobs keep their GPUs, the rest shortest remaining first.
        free = [p.gpus for p in fleet]
        keep: dict[int, tuple[float, list[int]]] = {}
        for i, (rate, holds) in running.items():
            if pinned[i]:
                keep[i] = (rate, holds)
                for k, n in enumerate(holds):
                    free[k] -= n
            else:
                insort(waiting, (left[i], i))
        placed: list[tuple[float, int]] = []
        for n, (work, i) in enumerate(waiting):
            if n >= walk or not any(free):
                break
            g = jobs[i].num_gpus
            for ks, rate in options[i]:
                if sum(free[k] for k in ks) >= g:
                    take = [0] * len(fleet)
                    for k in ks:
                        take[k] = min(free[k], g - sum(take))
                        free[k] -= take[k]
                    keep[i] = (rate, take)
                    placed.append((work, i))
                    if variant == "no-stops" or (variant == "live-movable" and not jobs[i].keeps_checkpoint):
                        pinned[i] = True
                    break
        for entry in placed:
            del waiting[bisect_left(waiting, entry)]
        running = keep
    return total_jct / len(jobs)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    fleet = pools(MIXED)
    print("pools: " + ", ".join(f"{p.gpus} {p.model}" for p in fleet))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            path = Path(tmp) / f"philly-s{seed}.csv"
            traces.write_csv(traces.prepare(traces.read_trace(traces.PHILLY, "philly"), seed, 2.0), path)
            jobs = load_jobs(path)
            t = time.perf_counter()
            bf = simulate(jobs, fleet_nodes(load_fleet(MIXED)), BACKFILL, model_facts(), interconnects()).mean_jct_s
            print(f"philly-s{seed}: backfill (live executor rules) mean JCT {bf / 3600:.3f} h "
                  f"({time.perf_counter() - t:.0f} s)")
            for variant in args.variants.split(","):
                t = time.perf_counter()
                mean = idealized(jobs, fleet, variant)
                print(f"philly-s{seed}: idealized ({variant}) mean JCT {mean / 3600:.3f} h = {mean / bf:.3f}x "
                      f"backfill (target 0.50x, bar 0.60x) ({time.perf_counter() - t:.0f} s)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
