"""A job's run as telemetry knows it (who, where, which GPUs, when), folded from its job events. No I/O.

A gang spanning nodes reports each node's part (`rank`): the run's GPUs are
all parts' of the current attempt, its node rank 0's, its start the first
part's start and its end the last reported end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from whaleflux.shared.events import EventData, JobFailed, JobFinished, JobPlaced, JobStarted, JobSubmitted

from .usage import JobUsage


@dataclass(frozen=True)
class JobRun:
    name: str | None = None
    team: str | None = None
    project: str | None = None
    cluster: str | None = None
    node: str | None = None
    attempt: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    started_at: datetime | None = None
    finished_at: datetime | None = None
    state: str | None = None  # placed | running | finished | failed
    usage: JobUsage | None = None  # stored once the run has ended and its usage settled

    @property
    def ended(self) -> bool:
        return self.finished_at is not None


JOB_EVENTS = (JobSubmitted, JobPlaced, JobStarted, JobFinished, JobFailed)


def apply(run: JobRun, data: EventData) -> JobRun:
    """The run after one of its job events (other events leave it as it is)."""
    if isinstance(data, JobSubmitted):
        return dataclasses.replace(run, name=data.name, team=data.team, project=data.project)
    if not isinstance(data, (JobPlaced, JobStarted, JobFinished, JobFailed)):
        return run
    if run.attempt is not None and data.attempt < run.attempt:
        return run  # an older attempt's event, arriving late, never overrides the newer attempt's run
    if isinstance(data, (JobPlaced, JobStarted)):
        return _placed_or_started(run, data)
    ended = data.finished_at if isinstance(data, JobFinished) else data.failed_at
    if data.rank is not None and run.finished_at is not None:  # a gang's run ends with its last part
        ended = max(ended, run.finished_at)
    state = "finished" if isinstance(data, JobFinished) else "failed"
    # A usage settled before a later part of a gang ended is out of date: it is settled again.
    return dataclasses.replace(run, finished_at=ended, state=state, usage=None)


def _placed_or_started(run: JobRun, data: JobPlaced | JobStarted) -> JobRun:
    same_attempt = run.attempt == data.attempt
    uuids = tuple(data.gpu_uuids)
    node = data.node
    if data.rank is not None and same_attempt and run.gpu_uuids:
        uuids = tuple(sorted(set(run.gpu_uuids) | set(data.gpu_uuids)))
        if data.rank:  # the job's node is its rank-0 node
            node = run.node or data.node
    new = dataclasses.replace(run, cluster=data.cluster, node=node, attempt=data.attempt, gpu_uuids=uuids,
                              finished_at=None, usage=None)
    if isinstance(data, JobPlaced):
        return dataclasses.replace(new, team=data.team, project=data.project, state="placed")
    started = data.started_at
    if data.rank is not None and same_attempt and run.started_at is not None and run.started_at < started:
        started = run.started_at  # the gang's run starts with its first part
    return dataclasses.replace(new, started_at=started, state="running")
