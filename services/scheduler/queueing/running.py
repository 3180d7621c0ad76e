"""The running jobs, with what every pass needs from them kept as they start and end.

A pass needs each team's GPUs in use (fair share, quotas) and, for the first
blocked job's reservation and for moves up, the running jobs in the order they
are expected to end; preemption looks only at the preemptible ones (and those
that keep a checkpoint, for a shorter job); moves up first ask whether any job
could move at all, by the groups of `movers`. Recomputed
from ~3,600 running jobs that is most of a steady pass's cost; `RunningJobs`
keeps all three up to date on each start and end, so a pass costs what
changed. It is a dict (jobs by id) and may be given as
`ScheduleRequest.running` wherever a plain mapping is: the decisions are the
same, only cheaper. Pure data structure, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable
from typing import NoReturn

from ..placement import JobRequest
from ..placement.framework import eligibility
from .jobs import RunningJob

# (end unknown, end, job): the order in which running jobs free their GPUs, by their estimates.
EndKey = tuple[bool, float, str]
# What decides where a job may move up and whether that is faster: its request's eligibility, its class,
# whether it needs more than one GPU, the GPUs it holds and the speed it runs at.
MoverKey = tuple[tuple[object, ...], str, bool, int, float]


def mover_key(r: RunningJob) -> MoverKey | None:
    """The job's group among those that may move up (a request, a checkpoint, a speed), or None."""
    req = r.request
    if req is None or not r.checkpointable or not r.speed:
        return None
    return (eligibility(req), req.workload_class, req.gpus > 1, r.gpus, r.speed)


def end_key(r: RunningJob) -> EndKey:
    """Where the job sorts among running jobs by when it ends (its estimate, else its assumed end; unknown last)."""
    end = r.expected_end if r.expected_end is not None else r.assumed_end
    return (end is None, end or 0.0, r.job_id)


class RunningJobs(dict[str, RunningJob]):
    """Running jobs by id, with each team's GPUs in use and the jobs by expected end kept current."""

    def __init__(self, jobs: Iterable[RunningJob] = ()) -> None:
        super().__init__()
        self.usage: Counter[str] = Counter()
        self.by_end: list[EndKey] = []
        self.preemptible: dict[str, RunningJob] = {}  # the jobs that may be preempted (few of them, often none)
        # The jobs that may move up, by group: how many, and one of their requests (`moves_up`).
        self.movers: dict[MoverKey, tuple[int, JobRequest]] = {}
        self.stoppable: dict[str, RunningJob] = {}  # preemptible or keeping a checkpoint (shortest remaining first)
        for r in jobs:
            self[r.job_id] = r

    def __setitem__(self, job_id: str, job: RunningJob) -> None:
        if job_id != job.job_id:
            raise ValueError(f"running job {job.job_id} stored as {job_id}")
        if job_id in self:
            self._forget(super().__getitem__(job_id))
        super().__setitem__(job_id, job)
        self.usage[job.team] += job.gpus
        insort(self.by_end, end_key(job))
        if job.preemptible:
            self.preemptible[job_id] = job
        if (key := mover_key(job)) is not None and job.request is not None:
            n, req = self.movers.get(key, (0, job.request))
            self.movers[key] = (n + 1, req)
        if job.preemptible or job.checkpointable:
            self.stoppable[job_id] = job

    def __delitem__(self, job_id: str) -> None:
        self._forget(super().__getitem__(job_id))
        super().__delitem__(job_id)

    def pop(self, job_id: str, *default: RunningJob | None) -> RunningJob | None:  # type: ignore[override]
        if job_id not in self:
            if default:
                return default[0]
            raise KeyError(job_id)
        job = super().__getitem__(job_id)
        del self[job_id]
        return job

    def _forget(self, job: RunningJob) -> None:
        self.usage[job.team] -= job.gpus
        if not self.usage[job.team]:
            del self.usage[job.team]
        key = end_key(job)
        del self.by_end[bisect_left(self.by_end, key)]
        self.preemptible.pop(job.job_id, None)
        if (group := mover_key(job)) is not None:
            n, req = self.movers[group]
            if n > 1:
                self.movers[group] = (n - 1, req)
            else:
                del self.movers[group]
        self.stoppable.pop(job.job_id, None)

    def __reduce__(self) -> tuple[type[RunningJobs], tuple[list[RunningJob]]]:
        return (RunningJobs, (list(self.values()),))  # copies and pickles rebuild the kept order and usage

    def _unsupported(self, *_: object, **__: object) -> NoReturn:
        raise TypeError("RunningJobs changes one job at a time: use [job_id] = job, del or pop")

    update = setdefault = popitem = clear = __ior__ = _unsupported
