"""The trace simulator: an event-driven replay of a workload through the real queue policy.

Job arrivals, completions and the ends of stopped attempts are the events;
after each instant with events one `schedule()` pass runs on the same cluster
index and queue the scheduler uses. Decisions are carried out as the live
service does (`rules.ExecutorRules`): a job that fits one node never spans
nodes; only a running one-node job that keeps a checkpoint may be moved; a
move or preemption stops the job (work done is kept), requeues it at its
original place, holds it until its old attempt has ended (`stop_s`), and a
later pass places it wherever it then fits, paying `resume_s`. The policy
sees each job's estimate (`SimJob.expected_runtime_s`), full length after a
resume as live; the job runs its true duration. A job runs
`duration_s / speed` where speed is its class's speed on the slowest GPU
model it got times the interconnect efficiency. Pure: time is virtual, no I/O.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..placement import ClusterState, Interconnects, JobRequest, ModelFacts, NodeState, Placement
from ..placement.framework import eligible
from ..queueing import (
    PendingJob,
    PendingQueue,
    PolicyConfig,
    RunningJob,
    RunningJobs,
    ScheduleReply,
    ScheduleRequest,
    TeamPolicy,
    schedule,
)
from ..queueing.jobs import estimate_left
from .metrics import JobOutcome, SimReport
from .report import Counts, build_report
from .rules import LIVE, ExecutorRules, executor_policy
from .usage import Usage
from .workload import SimJob

MIB_PER_GB = 1024


def request_for(job: SimJob) -> JobRequest:
    """The placement request of a trace job, as the live service builds one from a job spec."""
    return JobRequest(
        job_id=job.job_id,
        gpus=job.num_gpus,
        min_memory_mib=job.min_vram_gb * MIB_PER_GB,
        workload_class=job.workload_class,
        team=job.team,
        priority=job.priority,
        preemptible=job.preemptible,
        expected_runtime_s=job.expected_runtime_s,
        allow_multi_node=job.num_gpus > 1,
    )


@dataclass
class _Run:
    """One attempt of a job, running."""

    started_at: float
    speed: float
    work_left: float  # A100-seconds still to do when it started
    overhead: float  # start-up paid at its start (a resumed attempt)
    version: int


@dataclass
class _Job:
    """What the replay knows of one job."""

    job: SimJob
    seq: int
    request: JobRequest
    left: float  # A100-seconds of work still to do
    version: int = 0
    first_start: float | None = None
    finish: float | None = None
    run_s: float = 0.0
    moves: int = 0
    preemptions: int = 0
    models: list[str] = field(default_factory=list)
    rejected: str | None = None
    run: _Run | None = None


class _Replay:
    """The replay's state and its steps; `simulate` drives it."""

    def __init__(self, jobs: Sequence[SimJob], cluster: ClusterState, policy: PolicyConfig,
                 teams: Mapping[str, TeamPolicy], rules: ExecutorRules) -> None:
        self.jobs, self.cluster, self.policy, self.teams, self.rules = jobs, cluster, policy, teams, rules
        self.queue = PendingQueue(policy)
        self.running = RunningJobs()  # team usage and ends kept as jobs start and end
        self.state: dict[str, _Job] = {}
        self.events: list[tuple[float, int, str, str, int]] = []  # (time, seq, kind, job, version)
        self.seq = 0
        self.usage = Usage(cluster)
        self.gpu_s_by_team: dict[str, float] = defaultdict(float)
        self.preemptions = self.migrations = 0
        self.backfilled = 0

    def _push(self, t: float, kind: str, job_id: str, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, job_id, version))

    def _enqueue(self, st: _Job) -> None:
        pending = PendingJob(st.request, st.job.submit_time_s, st.seq, st.preemptions,
                             self.rules.move_any_job or st.job.keeps_checkpoint)
        self.queue.add(pending)
        self.usage.waiting(eligible(self.cluster, st.request, self.policy.profile), +1)

    def arrive(self, job: SimJob) -> None:
        """A submission: queued in arrival order."""
        self.seq += 1
        st = self.state[job.job_id] = _Job(job, self.seq, request_for(job), job.duration_s)
        self._enqueue(st)

    def event(self, kind: str, job_id: str, version: int, t: float) -> None:
        """An attempt's end (`end`), or a stopped attempt's end that lets the job be placed again (`held`)."""
        st = self.state[job_id]
        if version != st.version:
            return  # stopped since: this end belongs to an older attempt
        if kind == "held":
            self._enqueue(st)
            return
        self._stop(st, t)
        st.finish, st.left = t, 0.0

    def _stop(self, st: _Job, t: float) -> None:
        """The running attempt ends at `t`: work done is kept (a checkpoint), GPU time is counted."""
        run = st.run
        if run is None:
            raise RuntimeError(f"{st.job.job_id} is not running: the policy stopped a job twice")
        done = max(0.0, t - run.started_at - run.overhead) * run.speed
        st.left = max(1.0, run.work_left - done)
        st.run_s += t - run.started_at
        self.gpu_s_by_team[st.job.team] += st.job.num_gpus * (t - run.started_at)
        st.run = None
        st.version += 1
        del self.running[st.job.job_id]
        self.cluster.release(st.job.job_id)

    def stop_and_hold(self, job_id: str, t: float, moved: bool) -> None:
        """Stop a running job (a preemption or a move) and hold it until its old attempt has ended."""
        st = self.state[job_id]
        if self.rules.remaining_estimate_after_move if moved else self.rules.remaining_estimate_after_preemption:
            r = self.running[job_id]
            left = estimate_left(st.request.expected_runtime_s, r.started_at, r.expected_end, t)
            st.request = replace(st.request, expected_runtime_s=left)
        self._stop(st, t)
        if moved:
            st.moves += 1
            self.migrations += 1
        else:
            st.preemptions += 1
            self.preemptions += 1
        self._push(t + self.rules.stop_s, "held", job_id, st.version)

    def start(self, job_id: str, placement: Placement, expected_end: float | None, t: float) -> None:
        """Start an attempt on the placement the policy chose."""
        st = self.state[job_id]
        self.usage.waiting(eligible(self.cluster, st.request, self.policy.profile), -1)
        resumed = st.first_start is not None
        overhead = self.rules.resume_s if resumed else 0.0
        speed = placement.speed if placement.speed > 0 else 1e-9
        st.run = _Run(t, speed, st.left, overhead, st.version)
        if st.first_start is None:
            st.first_start = t
        for share in placement.shares:
            if share.model not in st.models:
                st.models.append(share.model)
        movable = self.rules.may_move(st.job, placement)
        self.running[job_id] = RunningJob(
            job_id, st.job.team, st.job.priority, st.job.preemptible, st.job.num_gpus, t, expected_end,
            st.preemptions, request=st.request if movable else None, speed=placement.speed if movable else None,
            checkpointable=movable, migrations=st.moves,
        )
        self._push(t + overhead + st.left / speed, "end", job_id, st.version)

    def apply(self, reply: ScheduleReply, t: float) -> None:
        """Carry out a pass's decisions the way the live executor does."""
        for p in reply.preempted:
            self.stop_and_hold(p.victim, t, moved=False)  # the policy released its GPUs already
        for m in reply.migrated:
            # The policy's new placement is not kept (live): the stop frees it, and the job is placed
            # again, wherever it then fits, once its old attempt has ended.
            self.stop_and_hold(m.job_id, t, moved=True)
        for s in reply.started:
            self.start(s.job.job_id, s.placement, s.expected_end, t)
            self.backfilled += int(s.backfilled)
        for job_id, reason in reply.infeasible.items():
            st = self.state[job_id]
            st.rejected = reason
            self.usage.waiting(eligible(self.cluster, st.request, self.policy.profile), -1)

    def outcomes(self) -> list[JobOutcome]:
        """Every submitted job's outcome, in submission order."""
        return [
            JobOutcome(st.job.job_id, st.job.team, st.job.workload_class, st.job.num_gpus, st.job.min_vram_gb,
                       st.job.priority, st.job.duration_s, st.job.submit_time_s, st.first_start, st.finish, st.run_s,
                       st.moves, st.preemptions, tuple(st.models), st.rejected)
            for st in self.state.values()
        ]

    def run(self) -> float:
        """Replay every submission; returns the time of the first one."""
        jobs, i = self.jobs, 0
        t = t0 = jobs[0].submit_time_s if jobs else 0.0
        while i < len(jobs) or self.events:
            next_t = min(jobs[i].submit_time_s if i < len(jobs) else float("inf"),
                         self.events[0][0] if self.events else float("inf"))
            self.usage.advance(next_t - t, bool(len(self.queue)))
            t = next_t
            while self.events and self.events[0][0] <= t:
                _, _, kind, job_id, version = heapq.heappop(self.events)
                self.event(kind, job_id, version, t)
            while i < len(jobs) and jobs[i].submit_time_s <= t:
                self.arrive(jobs[i])
                i += 1
            self.apply(schedule(ScheduleRequest(t, self.cluster, self.queue, self.running, self.policy, self.teams)), t)
            if i >= len(jobs) and not self.events and len(self.queue):
                break  # nothing runs or arrives and jobs still wait: they can never start
        return t0


def simulate(
    jobs: list[SimJob],
    nodes: list[NodeState],
    policy: PolicyConfig,
    facts: dict[str, ModelFacts] | None = None,
    interconnects: Interconnects | None = None,
    teams: dict[str, TeamPolicy] | None = None,
    rules: ExecutorRules = LIVE,
) -> SimReport:
    """Replay `jobs` (sorted by submit time) on `nodes` under `policy`, carried out by `rules`."""
    cluster = ClusterState(nodes, facts, interconnects or Interconnects())
    replay = _Replay(jobs, cluster, executor_policy(policy, rules), teams or {}, rules)
    t0 = replay.run()
    tiers = tuple(sorted({max(g.memory_total_mib for g in n.gpus) / MIB_PER_GB for n in nodes if n.gpus}))
    counts = Counts(replay.preemptions, replay.backfilled, replay.migrations)
    return build_report(policy.name, replay.outcomes(), replay.usage, replay.gpu_s_by_team, counts, t0, tiers)

