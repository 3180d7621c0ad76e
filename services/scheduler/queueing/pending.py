"""The waiting jobs, in lanes by priority class and team, walked in policy order."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator, Mapping

from .jobs import PendingJob, PolicyConfig, TeamPolicy, rank

_Key = tuple[float, float, int, str]
_NO_POLICY = TeamPolicy()  # a team without one: no quota, weight 1
_Entry = tuple[_Key, "PendingJob"]


def _order(job: PendingJob) -> _Key:
    return (0.0, job.submit_time, job.seq, job.job_id)


def _shortest_first(job: PendingJob) -> _Key:
    work = (job.request.expected_runtime_s or float("inf")) * job.request.gpus
    return (work, job.submit_time, job.seq, job.job_id)


class PendingQueue:
    """Jobs waiting to start. Pure data structure: no I/O, no clock."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._lanes: dict[tuple[int, str], list[_Entry]] = {}
        self._jobs: dict[str, PendingJob] = {}
        self._key = _shortest_first if config.shortest_first else _order

    def _lane(self, job: PendingJob) -> tuple[int, str]:
        r = rank(job.request.priority) if self.config.use_priorities else 0
        team = job.request.team if self.config.fair_share else "*"
        return (r, team)

    def add(self, job: PendingJob) -> None:
        """Queue a job (a requeued one keeps its place by its original submit time)."""
        if job.job_id in self._jobs:
            raise ValueError(f"job {job.job_id} is already queued")
        self._jobs[job.job_id] = job
        lane = self._lanes.setdefault(self._lane(job), [])
        entry = (self._key(job), job)
        if not lane or lane[-1][0] <= entry[0]:
            lane.append(entry)
        else:
            insort(lane, entry, key=lambda e: e[0])

    def remove(self, job_id: str) -> PendingJob | None:
        """Take a job out of the queue; None if it was not queued."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return None
        key = self._lane(job)
        lane = self._lanes[key]
        i = bisect_left(lane, self._key(job), key=lambda e: e[0])
        while lane[i][1].job_id != job_id:
            i += 1
        del lane[i]
        if not lane:
            del self._lanes[key]
        return job

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def any_needs_memory_above(self, mib: float) -> bool:
        """Whether some waiting job needs GPUs with more than `mib` of memory."""
        return any(j.request.min_memory_mib > mib for j in self._jobs.values())

    def get(self, job_id: str) -> PendingJob | None:
        return self._jobs.get(job_id)

    def ordered(
        self, usage: Mapping[str, int], teams: Mapping[str, TeamPolicy], now: float | None = None
    ) -> Iterator[PendingJob]:
        """Jobs in the order a pass considers them: aged jobs, then priority class, weighted fair share, age.

        With `config.aging_s` and `now`, every job that has waited that long
        comes first, oldest first, whatever its class or team: so no job waits
        behind an endless stream of higher-ranked ones (its wait is bounded as
        under FIFO). Among those, jobs never preempted come before preempted
        ones: a preempted job has started once already, and if it went ahead
        by its older submission, every preemption would push back the first
        start of the oldest jobs that never ran. Then, between teams of one class, the next job comes from
        the team furthest below its quota, then the one using least per unit
        of weight; `usage` is read at each step, so placements made during the
        pass count.
        """
        aged, lanes_now, start = self._split(now)
        if aged:
            for preempted in (False, True):
                lanes_of = [(e for e in lane if (e[1].preemptions > 0) is preempted) for lane in aged]
                yield from (job for _, job in heapq.merge(*lanes_of, key=_by_age))
        for r in sorted({k[0] for k in lanes_now}):
            lanes = {team: lane for (lr, team), lane in lanes_now.items() if lr == r}
            pos = {team: start.get((r, team), 0) for team in lanes}
            if len(lanes) == 1:
                team, lane = next(iter(lanes.items()))
                yield from (job for _, job in lane[pos[team]:])
                continue
            lanes = {team: lane for team, lane in lanes.items() if pos[team] < len(lane)}
            policies = {team: teams.get(team) or _NO_POLICY for team in lanes}
            heap = [(_team_key(policies[team], usage.get(team, 0)), lanes[team][pos[team]][0], team) for team in lanes]
            heapq.heapify(heap)
            replace, pop = heapq.heapreplace, heapq.heappop
            while heap:
                team = heap[0][2]
                lane = lanes[team]
                i = pos[team]
                yield lane[i][1]
                pos[team] = i = i + 1
                if i < len(lane):  # (the team's next job, keyed by its use now: placements count)
                    policy, used = policies[team], usage.get(team, 0)
                    quota = policy.quota_gpus  # (`_team_key`, inline: this runs for every job a pass walks)
                    key = (0 if quota is not None and used < quota else 1, used / policy.weight)
                    replace(heap, (key, lane[i][0], team))
                else:
                    pop(heap)

    def _split(
        self, now: float | None
    ) -> tuple[list[list[_Entry]], dict[tuple[int, str], list[_Entry]], dict[tuple[int, str], int]]:
        """The jobs submitted at least `aging_s` before `now` (per lane, oldest first), the lanes left for the
        rest, and where in each lane the rest starts (by age, aged jobs are a prefix of an oldest-first lane)."""
        aging = self.config.aging_s
        if aging is None or now is None:
            return [], self._lanes, {}
        cutoff = now - aging
        aged: list[list[_Entry]] = []
        start: dict[tuple[int, str], int] = {}
        if not self.config.shortest_first:
            for key, lane in self._lanes.items():
                n = bisect_right(lane, cutoff, key=lambda e: e[0][1])
                if n:
                    aged.append(lane[:n])
                    start[key] = n
            return aged, self._lanes, start
        rest: dict[tuple[int, str], list[_Entry]] = {}
        for key, lane in self._lanes.items():
            old = sorted((e for e in lane if e[0][1] <= cutoff), key=lambda e: e[0][1:])
            if old:
                aged.append(old)
            rest[key] = [e for e in lane if e[0][1] > cutoff] if old else lane
        return aged, rest, start


def _by_age(entry: _Entry) -> tuple[float, int, str]:
    return entry[0][1:]


def _team_key(policy: TeamPolicy, used: int) -> tuple[int, float]:
    """Teams below their quota first, then the least use per unit of weight."""
    within_quota = policy.quota_gpus is not None and used < policy.quota_gpus
    return (0 if within_quota else 1, used / policy.weight)
