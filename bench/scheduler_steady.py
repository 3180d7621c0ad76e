#!/usr/bin/env python3
"""Steady-state decisions: the pure core (no I/O) on a full fleet with a deep queue, jobs finishing and arriving.

    python bench/scheduler_steady.py [--nodes 1000] [--queue 10000] [--seconds 600] [--step 1] [--seed 1]
                                     [--variety] [--log FILE]

1,000 nodes x 8 GPUs (four models) are filled by a first pass from a queue of
`--queue` jobs of mixed shapes (as bench/scheduler_decisions.py: 1-16 GPUs,
memory needs, pools, four classes, three priorities, eight teams, runtimes
60 s - 30 min). Then a virtual clock advances `--step` s at a time for
`--seconds`: jobs whose runtime is over end (their GPUs are released), as many
new jobs arrive as were placed (the queue stays `--queue` deep), and one
`schedule()` pass runs, as the service runs one per change or per second.
Prints placements per CPU-second and per wall-second, and the decision
latency (the length of a pass: a job that became placeable waits at most that
long), p50/p99/max: over every pass after the first (the first ones still fill
the fleet: the first pass stops at its scan depth with GPUs free), and over the
full fleet alone, the passes from the first one that found no GPU free (the
steady state: a few GPUs freed per pass, a few placements). Target >= 5,000
placements per CPU-second (bar 2,000).

`--variety` makes some nodes cordoned, draining, hot, with a recent XID,
leased, with measured free memory or a quarantined GPU, so every filter
rejects somewhere. `--log FILE` writes every pass's reply (starts and their
placements, preemptions, moves, infeasible and waiting reasons, the head's
reservation) to FILE: a change to the core that must keep its decisions is
checked by running the bench on both trees (`PYTHONPATH` at a `git archive`
copy of the old one) and comparing the files byte for byte.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_decisions import CLASSES, SHAPES, fleet  # noqa: E402

from whaleflux.scheduler.placement import ClusterState, JobRequest, NodeState  # noqa: E402
from whaleflux.scheduler.queueing import (  # noqa: E402
    WHALEFLUX,
    PendingJob,
    PendingQueue,
    RunningJob,
    RunningJobs,
    ScheduleRequest,
    schedule,
)
from whaleflux.scheduler.simulator.fleet import interconnects, model_facts  # noqa: E402
from whaleflux.scheduler.simulator.metrics import percentile  # noqa: E402


def new_job(i: int, t: float, rng: random.Random) -> PendingJob:
    gpus = rng.choice(SHAPES)
    req = JobRequest(
        f"job-{i:06d}",
        gpus,
        min_memory_mib=rng.choice([0, 16, 40, 80, 100]) * 1024,
        workload_class=rng.choice(CLASSES),
        team=f"team-{rng.randrange(8)}",
        priority=rng.choice(["high", "normal", "normal", "low"]),
        expected_runtime_s=rng.uniform(60, 1800),
        allow_multi_node=gpus > 8,
        pool="onprem" if rng.random() < 0.1 else None,
    )
    return PendingJob(req, t, i)


def varied(nodes: list[NodeState]) -> list[NodeState]:
    """Some nodes unhealthy, leased, with measured free memory or a quarantined GPU (`--variety`)."""
    out = []
    for i, n in enumerate(nodes):
        gpus = n.gpus
        if i % 11 == 0:  # telemetry: a foreign process holds memory on some GPUs
            gpus = tuple(replace(g, memory_free_mib=g.memory_total_mib * (0.3 if g.index % 3 == 0 else 0.95))
                         for g in gpus)
        if i % 13 == 0:
            gpus = (replace(gpus[0], quarantined=True), *gpus[1:])
        out.append(replace(
            n,
            gpus=gpus,
            cordoned=i % 97 == 0,
            draining=i % 89 == 0,
            temperature_c=95.0 if i % 83 == 0 else None,
            thermal_limit_c=90.0 if i % 83 == 0 else None,
            last_critical_xid_at=0.0 if i % 79 == 0 else None,
            lease_expires_at=600.0 * (1 + i % 5) if i % 7 == 0 else None,
        ))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--queue", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=600.0, help="virtual seconds of steady state")
    ap.add_argument("--step", type=float, default=1.0, help="virtual seconds between passes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variety", action="store_true", help="unhealthy, leased and telemetry nodes too")
    ap.add_argument("--log", type=Path, help="write every pass's reply here (to compare two trees)")
    args = ap.parse_args()
    log = args.log.open("w") if args.log else None
    rng = random.Random(args.seed)
    policy = WHALEFLUX
    nodes = fleet(args.nodes)
    cluster = ClusterState(varied(nodes) if args.variety else nodes, model_facts(), interconnects())
    queue = PendingQueue(policy)
    running = RunningJobs()  # team usage and ends kept as jobs start and end, as the simulator does
    ends: list[tuple[float, str]] = []
    seq = 0
    for _ in range(args.queue):
        queue.add(new_job(seq, 0.0, rng))
        seq += 1

    def apply(reply, t: float) -> int:
        nonlocal seq
        for p in reply.preempted:
            running.pop(p.victim, None)
        for m in reply.migrated:
            job = running[m.job_id]
            running[m.job_id] = replace(
                job, started_at=t, expected_end=m.expected_end, speed=m.placement.speed, migrations=job.migrations + 1
            )
            heapq.heappush(ends, (m.expected_end or t + 600, m.job_id))
        for s in reply.started:
            req = s.job.request
            end = s.expected_end or t + (req.expected_runtime_s or 600)
            running[req.job_id] = RunningJob(
                req.job_id,
                req.team,
                req.priority,
                req.preemptible,
                req.gpus,
                t,
                end,
                s.job.preemptions,
                request=req,
                speed=s.placement.speed,
                checkpointable=True,
            )
            heapq.heappush(ends, (end, req.job_id))
        # As many arrive as left the queue: it stays as deep.
        for _ in range(len(reply.started) + len(reply.infeasible)):
            queue.add(new_job(seq, t, rng))
            seq += 1
        return len(reply.started)

    # Fill the fleet (not measured: a cold pass is bench/scheduler_decisions.py's figure).
    t = 0.0
    first = schedule(ScheduleRequest(t, cluster, queue, running, policy))
    if log:
        log.write(f"{t} {first!r}\n")
    filled = apply(first, t)
    print(
        f"{args.nodes} nodes x 8 GPUs, queue {args.queue}: first pass placed {filled} jobs, "
        f"{cluster.total_free} GPUs left free"
    )

    placed = passes = 0
    cpu = wall = 0.0
    lengths = []
    full: list[tuple[int, float, float]] = []  # (placed, CPU s, wall s) of each pass since the fleet was full
    while t < args.seconds:
        t += args.step
        while ends and ends[0][0] <= t:
            _end, job_id = heapq.heappop(ends)
            job = running.get(job_id)
            if job is None or (job.expected_end is not None and job.expected_end > t):
                continue  # preempted or moved since
            del running[job_id]
            cluster.release(job_id)
        was_full = bool(full) or cluster.total_free == 0
        c0, w0 = time.process_time(), time.perf_counter()
        reply = schedule(ScheduleRequest(t, cluster, queue, running, policy))
        c1, w1 = time.process_time(), time.perf_counter()
        cpu += c1 - c0
        wall += w1 - w0
        lengths.append(w1 - w0)
        if log:
            log.write(f"{t} {reply!r}\n")
        n = apply(reply, t)
        placed += n
        passes += 1
        if was_full:
            full.append((n, c1 - c0, w1 - w0))
    lengths.sort()
    if log:
        log.close()
    print(
        f"steady state: {passes} passes over {args.seconds:g} virtual s, {placed} placed "
        f"({placed / passes:.1f} per pass), queue {len(queue)} deep, {len(running)} running, "
        f"{cluster.total_free} GPUs free at the end"
    )
    print(f"all passes after the first (the fill's tail too): {placed / cpu:,.0f} placements per CPU-second, "
          f"{placed / wall:,.0f} per wall-second")
    print(
        f"  decision latency (pass length): p50 {percentile(lengths, 50) * 1e3:.1f} ms, "
        f"p99 {percentile(lengths, 99) * 1e3:.1f} ms, max {lengths[-1] * 1e3:.1f} ms"
    )
    if not full:
        print("the fleet never filled: no steady state to report")
        return 0
    n, c, w = (sum(x) for x in zip(*full, strict=True))
    fl = sorted(x[2] for x in full)
    print(f"full fleet (the {len(full)} passes from the first that found no GPU free): {n} placed, "
          f"{n / len(full):.1f} per pass")
    print(f"  placements per CPU-second: {n / c:,.0f}   (target >= 5,000, bar 2,000)")
    print(f"  placements per wall-second: {n / w:,.0f}")
    print(f"  decision latency (pass length): p50 {percentile(fl, 50) * 1e3:.1f} ms, "
          f"p99 {percentile(fl, 99) * 1e3:.1f} ms, max {fl[-1] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
