#!/usr/bin/env python3
"""What a live pass builds before it decides, at scale: `python bench/scheduler_pass_input.py [--passes 20]`.

The service's pass (services/scheduler/passes.py) turns the store into the
policy's request: a node view and node state per node, the `ClusterState`, the
queue and the running jobs (`PassState`). Here, with no I/O, on the scale
bench's fleet (1,000 nodes x 8 GPUs, four models, `--jobs` one-GPU jobs: the
fleet full, the rest queued), `--passes` passes run as GPUs come free at the
rate the scale bench frees them: `--finish` jobs end before each pass and the
pass places as many waiting jobs. Each pass is run twice on the same state,
alternating: with the cluster state kept across passes (`PassState.cluster`,
HEAD) and built afresh (the reference, as every pass did before), and the two
must decide the same placements. Prints the median milliseconds of each stage
and of the whole input plus `schedule()`, for both, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whaleflux.scheduler.pass_state import PassState  # noqa: E402
from whaleflux.scheduler.placement import ClusterState, ModelFacts  # noqa: E402
from whaleflux.scheduler.queueing import ScheduleReply, ScheduleRequest, schedule  # noqa: E402
from whaleflux.scheduler.records import JobRecord  # noqa: E402
from whaleflux.scheduler.schedule_request import NodeView  # noqa: E402
from whaleflux.scheduler.settings import SchedulerSettings  # noqa: E402
from whaleflux.shared.catalog import gpu_models  # noqa: E402
from whaleflux.shared.events import GpuIdentity, JobSubmitted, NodeRegistered  # noqa: E402

T0 = datetime(2026, 12, 1, tzinfo=UTC)
# (name, model, share of the nodes, cluster, pool), as bench/scheduler_scale.py's fleet.
GROUPS = [("a100", "A100", 0.3, "onprem", "onprem"), ("h100", "H100", 0.4, "onprem", "onprem"),
          ("h200", "H200", 0.2, "cloud-a", "cloud"), ("r4090", "RTX4090", 0.1, "onprem", "dev")]
STAGES = ["views", "node states", "cluster", "queue+running", "schedule"]


class Store:
    """The store as a pass reads it: records replaced, never changed in place, when written."""

    def __init__(self, nodes: int, jobs: int):
        self.regs: dict[str, NodeRegistered] = {}
        for name, model, share, cluster, pool in GROUPS:
            for k in range(round(nodes * share)):
                node = f"{name}-{k + 1:03d}"
                gpus = [GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=81559)
                        for i in range(8)]
                self.regs[f"{cluster}/{node}"] = NodeRegistered(cluster=cluster, node=node, interconnect="nvlink",
                                                                agent_version="bench", gpus=gpus, pool=pool)
        self.records: dict[str, JobRecord] = {}
        for i in range(jobs):
            job_id = f"scale-{i:05d}"
            spec = JobSubmitted(job_id=job_id, name=job_id, team="bench", command=["sleep", "60"])
            self.records[job_id] = JobRecord(job_id=job_id, spec=spec, submitted_at=T0)
        self.alloc: dict[str, str] = {}

    def apply(self, reply: ScheduleReply, now: datetime) -> None:
        for s in reply.started:
            uuids = list(s.placement.gpu_uuids)
            self.records[s.job.job_id] = self.records[s.job.job_id].model_copy(update=dict(
                state="placed", cluster=s.placement.cluster, node=s.placement.node, gpu_uuids=uuids, placed_at=now,
                attempt=1))
            self.alloc.update(dict.fromkeys(uuids, s.job.job_id))

    def finish(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            job = self.records[job_id]
            for uuid in job.gpu_uuids:
                del self.alloc[uuid]
            self.records[job_id] = job.model_copy(update=dict(state="succeeded"))


def one_pass(store: Store, kept: PassState, keep_cluster: bool, now: datetime, settings: SchedulerSettings,
             facts: dict[str, ModelFacts]) -> tuple[ScheduleReply, dict[str, float]]:
    t = [time.perf_counter()]
    views = [NodeView(reg) for _key, reg in sorted(store.regs.items())]
    t.append(time.perf_counter())
    states = kept.node_states(views, store.alloc)
    t.append(time.perf_counter())
    cluster = kept.cluster(states, facts) if keep_cluster else ClusterState(states, facts)
    t.append(time.perf_counter())
    pending = [j for j, r in store.records.items() if r.state == "pending"]
    queue = kept.sync_queue(store.records, pending, now)
    running = kept.sync_running(store.records, sorted(set(store.alloc.values())), cluster, now.timestamp())
    t.append(time.perf_counter())
    reply = schedule(ScheduleRequest(now.timestamp(), cluster, queue, running, settings.policy_config(),
                                     settings.team_policies()))
    kept.passed(reply)
    t.append(time.perf_counter())
    return reply, {name: (t[i + 1] - t[i]) * 1000 for i, name in enumerate(STAGES)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--finish", type=int, default=100, help="jobs that end before each pass")
    args = ap.parse_args()
    settings = SchedulerSettings()
    facts = {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}
    # Two stores, the same history: one pass state keeps its cluster, the other builds it afresh each pass.
    runs = {True: (Store(args.nodes, args.jobs), PassState(settings.policy_config())),
            False: (Store(args.nodes, args.jobs), PassState(settings.policy_config()))}
    now = T0 + timedelta(seconds=1)
    while True:  # fill the fleet
        replies = {k: one_pass(store, kept, k, now, settings, facts)[0] for k, (store, kept) in runs.items()}
        for k, (store, _kept) in runs.items():
            store.apply(replies[k], now)
        if not replies[True].started:
            break
    times: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.passes):
        now += timedelta(seconds=0.2)
        ending = sorted(set(runs[True][0].alloc.values()))[: args.finish]
        placed = {}
        for k in (False, True):  # alternating, the reference first
            store, kept = runs[k]
            store.finish(ending)
            reply, took = one_pass(store, kept, k, now, settings, facts)
            store.apply(reply, now)
            times[k].append(took)
            placed[k] = [(s.job.job_id, s.placement) for s in reply.started]
        if placed[True] != placed[False]:
            raise SystemExit("the kept cluster state decided otherwise than one built afresh")
    print(f"{args.nodes} nodes x 8 GPUs, {args.jobs} one-GPU jobs, {args.passes} passes after "
          f"{args.finish} jobs end each (median ms per pass; the same placements both ways)")
    totals = {}
    for k, label in ((False, "built afresh (reference)"), (True, "kept cluster state (HEAD)")):
        med = {name: statistics.median(t[name] for t in times[k]) for name in STAGES}
        totals[k] = statistics.median(sum(t.values()) for t in times[k])
        print(f"  {label:27s} " + "  ".join(f"{n} {v:.1f}" for n, v in med.items()) + f"   total {totals[k]:.1f} ms")
    print(f"kept / afresh: {totals[True] / totals[False]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
