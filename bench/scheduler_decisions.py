#!/usr/bin/env python3
"""Benchmark: placement decisions on 1,000 nodes x 8 GPUs with 10,000 pending jobs of mixed shapes.

Two figures: one `schedule()` pass over the whole queue (placements per
second), and the latency of single decisions (`place_on` + allocate), p50/p99.

    python bench/scheduler_decisions.py [--nodes 1000] [--jobs 10000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace

from whaleflux.scheduler.placement import ClusterState, GpuState, JobRequest, NodeState, Placement, place_on
from whaleflux.scheduler.queueing import WHALEFLUX, PendingJob, PendingQueue, ScheduleRequest, schedule
from whaleflux.scheduler.simulator.fleet import interconnects, model_facts
from whaleflux.scheduler.simulator.metrics import percentile

MODELS = [
    ("RTX4090", 24_564, "pcie"),
    ("A100", 81_920, "nvlink"),
    ("H100", 81_559, "nvlink"),
    ("H200", 143_771, "nvlink"),
]
CLASSES = ["small", "finetune", "inference", "llm-train"]
SHAPES = [1] * 70 + [2] * 10 + [4] * 10 + [8] * 8 + [16] * 2


def fleet(n: int) -> list[NodeState]:
    nodes = []
    for i in range(n):
        model, mem, link = MODELS[i % len(MODELS)]
        gpus = tuple(GpuState(f"n{i}-g{g}", g, mem) for g in range(8))
        nodes.append(NodeState(f"node-{i:04d}", "c", model, link, gpus, pool="onprem" if i % 5 else "cloud"))
    return nodes


def jobs(n: int, rng: random.Random) -> list[PendingJob]:
    out = []
    for i in range(n):
        gpus = rng.choice(SHAPES)
        req = JobRequest(
            f"job-{i:05d}",
            gpus,
            min_memory_mib=rng.choice([0, 16, 40, 80, 100]) * 1024,
            workload_class=rng.choice(CLASSES),
            team=f"team-{rng.randrange(8)}",
            priority=rng.choice(["high", "normal", "normal", "low"]),
            expected_runtime_s=rng.uniform(60, 36_000),
            allow_multi_node=gpus > 8,
            pool="onprem" if rng.random() < 0.1 else None,
        )
        out.append(PendingJob(req, float(i), i))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    facts, links = model_facts(), interconnects()
    pending = jobs(args.jobs, random.Random(args.seed))
    policy = replace(WHALEFLUX, scan_depth=args.jobs, max_misses_in_a_row=args.jobs)

    # One pass of the queue policy over every waiting job.
    cluster = ClusterState(fleet(args.nodes), facts, links)
    queue = PendingQueue(policy)
    for job in pending:
        queue.add(job)
    t = time.perf_counter()
    reply = schedule(ScheduleRequest(0.0, cluster, queue, {}, policy))
    wall = time.perf_counter() - t
    placed = len(reply.started)
    print(
        f"schedule(): {args.nodes} nodes x 8 GPUs, {args.jobs} pending -> {placed} placed, "
        f"{len(reply.waiting)} waiting, {len(reply.infeasible)} infeasible in {wall:.2f} s "
        f"= {placed / wall:,.0f} placements/s (the pass stops once no GPU is free)"
    )

    # Single decisions, each timed: place_on + allocate, until the fleet is full.
    cluster = ClusterState(fleet(args.nodes), facts, links)
    latencies, ok = [], 0
    for job in pending:
        t = time.perf_counter()
        d = place_on(cluster, job.request, policy.profile, 0.0)
        if isinstance(d, Placement):
            cluster.allocate(job.job_id, d)
            ok += 1
        latencies.append(time.perf_counter() - t)
    latencies.sort()
    print(
        f"place_on(): {len(latencies)} decisions ({ok} placed): p50 {percentile(latencies, 50) * 1e3:.3f} ms, "
        f"p99 {percentile(latencies, 99) * 1e3:.3f} ms, max {latencies[-1] * 1e3:.1f} ms, "
        f"{len(latencies) / sum(latencies):,.0f} decisions/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
