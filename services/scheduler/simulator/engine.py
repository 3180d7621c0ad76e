"""The trace simulator: an event-driven replay of a workload through the real queue policy.

Job arrivals and completions are the events; after each instant with events
one `schedule()` pass runs on the same cluster index and queue the scheduler
uses. A job runs `duration_s / speed` where speed is its class's speed on the
slowest GPU model it got times the interconnect efficiency (one node: NVLink
or PCIe; spanning nodes: that times `cross_node`). A preempted job keeps the
work it did (it checkpoints on SIGTERM) and pays `restart_overhead_s` when it
resumes; so does a migrated job, which resumes at once on its new GPUs (every
trace job counts as checkpointable). Pure: time is virtual, no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from ..placement import ClusterState, Interconnects, JobRequest, ModelFacts, NodeState
from ..placement.framework import eligible
from ..queueing import PendingJob, PendingQueue, PolicyConfig, RunningJob, ScheduleRequest, TeamPolicy, schedule
from .metrics import SimReport, TeamReport, percentile
from .workload import SimJob

MIB_PER_GB = 1024


@dataclass
class _Run:
    job: SimJob
    pending: PendingJob
    started_at: float
    speed: float
    work_left: float  # A100-seconds still to do when it started
    end: float
    version: int
    overhead: float = 0.0  # restart overhead paid at its start (resumed from a checkpoint)
    migrations: int = 0


def request_for(job: SimJob) -> JobRequest:
    """The placement request of a trace job; its duration is its expected runtime."""
    return JobRequest(
        job_id=job.job_id,
        gpus=job.num_gpus,
        min_memory_mib=job.min_vram_gb * MIB_PER_GB,
        workload_class=job.workload_class,
        team=job.team,
        priority=job.priority,
        preemptible=job.preemptible,
        expected_runtime_s=job.duration_s,
        allow_multi_node=True,
    )


def simulate(
    jobs: list[SimJob],
    nodes: list[NodeState],
    policy: PolicyConfig,
    facts: dict[str, ModelFacts] | None = None,
    interconnects: Interconnects = Interconnects(),
    teams: dict[str, TeamPolicy] | None = None,
    restart_overhead_s: float = 60.0,
) -> SimReport:
    """Replay `jobs` (sorted by submit time) on `nodes` under `policy`."""
    cluster = ClusterState(nodes, facts, interconnects)
    queue = PendingQueue(policy)
    teams = teams or {}
    running: dict[str, RunningJob] = {}
    runs: dict[str, _Run] = {}
    versions: Counter[str] = Counter()
    ends: list[tuple[float, int, str, int]] = []
    seq = 0
    first_start: dict[str, float] = {}
    finish: dict[str, float] = {}
    rejected: dict[str, str] = {}
    gpu_seconds_by_team: Counter[str] = Counter()
    preemptions = backfilled = migrations = 0
    alloc_gpu_s = waiting_s = alloc_while_waiting = 0.0
    by_id = {j.job_id: j for j in jobs}
    # The secondary "usable" busy utilization: of the GPUs some waiting job could use (model
    # allowed, memory fits), the share held. Waiting jobs are counted by their static view.
    views: dict[int, list[str]] = {}
    waiting_views: Counter[int] = Counter()
    usable_nodes: dict[frozenset, list[str]] = {}
    usable_gpu_s = usable_held_gpu_s = 0.0

    def _view(req: JobRequest) -> int:
        view = eligible(cluster, req, policy.profile)
        views.setdefault(id(view), view.nodes)
        return id(view)

    def _run(job: SimJob, pending: PendingJob, placement, t: float, overhead: float, expected_end, moved: int) -> None:
        nonlocal seq
        work = pending.request.expected_runtime_s or job.duration_s
        end = t + overhead + work / placement.speed
        versions[job.job_id] += 1
        runs[job.job_id] = _Run(job, pending, t, placement.speed, work, end, versions[job.job_id], overhead, moved)
        running[job.job_id] = RunningJob(
            job.job_id, job.team, job.priority, job.preemptible, job.num_gpus, t, expected_end, pending.preemptions,
            request=pending.request, speed=placement.speed, checkpointable=True, migrations=moved,
        )
        heapq.heappush(ends, (end, seq, job.job_id, versions[job.job_id]))
        seq += 1
    i, t = 0, jobs[0].submit_time_s if jobs else 0.0
    t0 = t

    while i < len(jobs) or ends:
        next_t = min(jobs[i].submit_time_s if i < len(jobs) else float("inf"), ends[0][0] if ends else float("inf"))
        dt = next_t - t
        held = cluster.total_gpus - cluster.total_free
        alloc_gpu_s += held * dt
        if len(queue):
            waiting_s += dt
            alloc_while_waiting += held * dt
            key = frozenset(k for k, n in waiting_views.items() if n > 0)
            names = usable_nodes.get(key)
            if names is None:
                names = usable_nodes[key] = sorted({n for k in key for n in views[k]})
            total = sum(len(cluster.gpus[n]) for n in names)
            usable_gpu_s += total * dt
            usable_held_gpu_s += (total - sum(len(cluster.free[n]) for n in names)) * dt
        t = next_t
        while ends and ends[0][0] <= t:
            _, _, job_id, version = heapq.heappop(ends)
            if versions[job_id] != version:
                continue  # preempted since
            run = runs.pop(job_id)
            del running[job_id]
            cluster.release(job_id)
            gpu_seconds_by_team[run.job.team] += run.job.num_gpus * (t - run.started_at)
            finish[job_id] = t
        while i < len(jobs) and jobs[i].submit_time_s <= t:
            seq += 1
            queue.add(PendingJob(request_for(jobs[i]), jobs[i].submit_time_s, seq))
            waiting_views[_view(request_for(jobs[i]))] += 1
            i += 1
        reply = schedule(ScheduleRequest(t, cluster, queue, running, policy, teams))
        for p in reply.preempted:
            run = runs.pop(p.victim)
            del running[p.victim]
            versions[p.victim] += 1
            preemptions += 1
            left = _work_left(run, t)
            gpu_seconds_by_team[run.job.team] += run.job.num_gpus * (t - run.started_at)
            resumed = replace(
                run.pending,
                request=replace(run.pending.request, expected_runtime_s=left),
                preemptions=run.pending.preemptions + 1,
            )
            queue.add(resumed)
            waiting_views[_view(resumed.request)] += 1
        for m in reply.migrated:
            # Stopped with a checkpoint and resumed at once on the faster GPUs (pays the restart overhead).
            run = runs[m.job_id]
            migrations += 1
            left = _work_left(run, t)
            gpu_seconds_by_team[run.job.team] += run.job.num_gpus * (t - run.started_at)
            pending = replace(run.pending, request=replace(run.pending.request, expected_runtime_s=left))
            _run(run.job, pending, m.placement, t, restart_overhead_s, m.expected_end, run.migrations + 1)
        for s in reply.started:
            job = by_id[s.job.job_id]
            _run(job, s.job, s.placement, t, restart_overhead_s if s.job.preemptions else 0.0, s.expected_end, 0)
            waiting_views[_view(s.job.request)] -= 1
            first_start.setdefault(job.job_id, t)
            backfilled += s.backfilled
        rejected.update(reply.infeasible)
        for job_id in reply.infeasible:
            waiting_views[_view(request_for(by_id[job_id]))] -= 1
        if i >= len(jobs) and not ends and len(queue):
            break  # nothing runs or arrives and jobs still wait: they can never start

    return _report(policy.name, jobs, cluster.total_gpus, t0, first_start, finish, rejected, gpu_seconds_by_team,
                   alloc_gpu_s, waiting_s, alloc_while_waiting, preemptions, backfilled, migrations,
                   usable_held_gpu_s / usable_gpu_s if usable_gpu_s else 1.0)


def _work_left(run: _Run, t: float) -> float:
    """A100-seconds of work the run still has at `t` (work done before a stop is kept: checkpoint)."""
    done = max(0.0, t - run.started_at - run.overhead) * run.speed
    return max(1.0, run.work_left - done)


def _report(name, jobs, fleet_gpus, t0, first_start, finish, rejected, gpu_s_by_team, alloc_gpu_s, waiting_s,
            alloc_while_waiting, preemptions, backfilled, migrations, busy_usable) -> SimReport:
    done = [j for j in jobs if j.job_id in finish]
    jct = sorted(finish[j.job_id] - j.submit_time_s for j in done)
    queueing = [first_start[j.job_id] - j.submit_time_s for j in done]
    makespan = (max(finish.values()) - t0) if finish else 0.0
    slowdowns: dict[str, list[float]] = defaultdict(list)
    for j in done:
        slowdowns[j.team].append((finish[j.job_id] - j.submit_time_s) / max(1.0, j.duration_s))
    total_gpu_s = sum(gpu_s_by_team.values()) or 1.0
    teams = [
        TeamReport(team, len(slowdowns[team]), gpu_s_by_team[team], gpu_s_by_team[team] / total_gpu_s,
                   sum(slowdowns[team]) / len(slowdowns[team]) if slowdowns[team] else 0.0)
        for team in sorted(set(gpu_s_by_team) | set(slowdowns))
    ]
    return SimReport(
        policy=name,
        jobs=len(jobs),
        finished=len(done),
        rejected=len(rejected),
        mean_jct_s=sum(jct) / len(jct) if jct else 0.0,
        p50_jct_s=percentile(jct, 50),
        p99_jct_s=percentile(jct, 99),
        mean_queueing_s=sum(queueing) / len(queueing) if queueing else 0.0,
        makespan_s=makespan,
        utilization=alloc_gpu_s / (fleet_gpus * makespan) if makespan else 0.0,
        # Capacity used while work waited: GPU-seconds held in those seconds over all GPU-seconds then.
        busy_utilization=alloc_while_waiting / (fleet_gpus * waiting_s) if waiting_s else 1.0,
        busy_utilization_usable=busy_usable,
        busy_utilization_literal=alloc_gpu_s / (fleet_gpus * waiting_s) if waiting_s else 1.0,
        preemptions=preemptions,
        backfilled=backfilled,
        migrations=migrations,
        teams=teams,
        rejections=dict(list(rejected.items())[:20]),
    )
