"""Which attempt holds GPU X: one fold over `job.*` events, shared by billing, inventory and telemetry. Pure.

A GPU is held from the first `job.placed` or `job.started` of an attempt's part
that names it, until that part ends (`job.finished`, `job.failed`) or the
scheduler takes the attempt back (`job.requeued`). Events may arrive out of
order (redelivery, replay), so:

- an older attempt's event never overrides a newer attempt: once attempt N of a
  job is seen, events of attempts < N change nothing, and attempt N's first
  event releases what the older attempts still held;
- a finished attempt releases: an end that arrives before its placement is
  remembered, and the late placement or start holds nothing;
- a GPU is released only by its own holder's end (a later job on the same GPU
  keeps it when the earlier job's end comes late).

The fold is incremental so a store can keep it: per job a `JobHolds` (its latest
attempt, each part's GPUs, which parts ended), per GPU a `Holder`.
`gpus_involved` says which GPUs' holders an event needs; `fold_holders` returns
the job's new `JobHolds` and the holders to set and clear. `GpuHolders` keeps it
all in memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..events import EventData, JobFailed, JobFinished, JobPlaced, JobRequeued, JobStarted

JOB_EVENTS = (JobPlaced, JobStarted, JobFinished, JobFailed, JobRequeued)
_HOLDING = (JobPlaced, JobStarted)
_ENDING = (JobFinished, JobFailed)


@dataclass(frozen=True)
class Holder:
    """The part of a job attempt holding one GPU, since when, and when it started running (if it did)."""

    job_id: str
    attempt: int
    rank: int  # the part of a gang spanning nodes; 0 for a job on one node
    since: datetime  # the time of the first event that held it (the placement, normally)
    started_at: datetime | None = None

    @property
    def attempt_key(self) -> str:
        """`<job>:<attempt>`: what the attempt's GPU time and energy are charged to."""
        return f"{self.job_id}:{self.attempt}"

    @property
    def part_key(self) -> str:
        """`<job>:<attempt>`, plus `#r<rank>` for a gang's part on a node other than the first."""
        return self.attempt_key + (f"#r{self.rank}" if self.rank else "")

    def same_part(self, job_id: str, attempt: int, rank: int) -> bool:
        return (self.job_id, self.attempt, self.rank) == (job_id, attempt, rank)

    def encode(self) -> str:
        """One string for a store (a Redis hash field per GPU)."""
        started = self.started_at.isoformat() if self.started_at else None
        return json.dumps([self.job_id, self.attempt, self.rank, self.since.isoformat(), started])

    @classmethod
    def decode(cls, raw: str) -> Holder:
        job_id, attempt, rank, since, started = json.loads(raw)
        return cls(job_id, int(attempt), int(rank), datetime.fromisoformat(since),
                   datetime.fromisoformat(started) if started else None)


@dataclass(frozen=True)
class JobHolds:
    """What the fold remembers of one job: its latest attempt, each part's GPUs, which parts ended."""

    attempt: int = 0
    parts: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # rank -> GPUs
    ended: frozenset[int] = frozenset()  # ranks of `attempt` that ended
    closed: bool = False  # the whole attempt was taken back (requeued): none of its parts holds again

    def gpus(self) -> set[str]:
        return {g for gpus in self.parts.values() for g in gpus}

    def encode(self) -> str:
        return json.dumps({"a": self.attempt, "p": {str(r): list(g) for r, g in self.parts.items()},
                           "e": sorted(self.ended), "c": self.closed})

    @classmethod
    def decode(cls, raw: str) -> JobHolds:
        doc = json.loads(raw)
        return cls(int(doc["a"]), {int(r): tuple(g) for r, g in doc["p"].items()}, frozenset(doc["e"]),
                   bool(doc["c"]))


@dataclass(frozen=True)
class HolderChange:
    """The outcome of one event: the job's new holds, GPUs now held (set these), GPUs released (clear these)."""

    job: JobHolds
    hold: dict[str, Holder] = field(default_factory=dict)
    release: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.hold or self.release)


def gpus_involved(job: JobHolds, data: EventData) -> set[str]:
    """The GPUs whose current holders `fold_holders` needs for this event."""
    named = set(data.gpu_uuids) if isinstance(data, _HOLDING) else set()
    return named | job.gpus()


def fold_holders(job: JobHolds, data: EventData, at: datetime, current: Mapping[str, Holder | None]) -> HolderChange:
    """Apply one job event (`at`: its envelope time) to one job's holds; `current`: holders of `gpus_involved`.

    Events other than placed/started/finished/failed/requeued change nothing."""
    if not isinstance(data, JOB_EVENTS) or data.attempt < job.attempt:
        return HolderChange(job)  # another kind of event, or an older attempt's: never overrides a newer one
    release: list[str] = []
    if data.attempt > job.attempt:
        # A newer attempt: what older attempts of the job still hold is theirs no longer.
        if job.parts:
            release = [g for g in sorted(job.gpus()) if _held_by_older(current.get(g), data.job_id, data.attempt)]
        job = JobHolds(attempt=data.attempt)
    if isinstance(data, JobRequeued):
        mine = [g for g in sorted(job.gpus()) if _held_by_attempt(current.get(g), data.job_id, data.attempt)]
        return HolderChange(JobHolds(job.attempt, job.parts, job.ended | set(job.parts), True),
                            release=(*release, *mine))
    rank = data.rank or 0
    if isinstance(data, _ENDING):
        gpus = job.parts.get(rank, ())
        mine = [g for g in gpus if (h := current.get(g)) is not None and h.same_part(data.job_id, data.attempt, rank)]
        return HolderChange(JobHolds(job.attempt, job.parts, job.ended | {rank}, job.closed),
                            release=(*release, *mine))
    if job.closed or rank in job.ended:
        return HolderChange(job, release=tuple(release))  # its end came first: a late placement holds nothing
    had = job.parts.get(rank, ())
    gpus = tuple(dict.fromkeys((*had, *data.gpu_uuids)))
    if gpus != had:  # a start names the GPUs its placement did: the holds stand as they are
        # Constructors, not dataclasses.replace: this runs once per job event (thousands a second).
        job = JobHolds(job.attempt, {**job.parts, rank: gpus}, job.ended, job.closed)
    started = data.started_at if isinstance(data, JobStarted) else None
    hold: dict[str, Holder] = {}
    for g in data.gpu_uuids:
        held = current.get(g)
        if held is not None and held.same_part(data.job_id, data.attempt, rank):
            if started is not None and held.started_at is None:
                hold[g] = Holder(held.job_id, held.attempt, held.rank, held.since, started)
            continue  # held already, since its first event
        hold[g] = Holder(data.job_id, data.attempt, rank, since=at, started_at=started)
    return HolderChange(job, hold=hold, release=tuple(g for g in release if g not in hold) if release else ())


def _held_by_older(holder: Holder | None, job_id: str, attempt: int) -> bool:
    return holder is not None and holder.job_id == job_id and holder.attempt < attempt


def _held_by_attempt(holder: Holder | None, job_id: str, attempt: int) -> bool:
    return holder is not None and holder.job_id == job_id and holder.attempt == attempt


class GpuHolders:
    """The fold kept in memory: every job's holds and every GPU's holder."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobHolds] = {}
        self.holders: dict[str, Holder] = {}

    def apply(self, data: EventData, at: datetime) -> HolderChange:
        """Fold one event in; returns what changed."""
        job_id = getattr(data, "job_id", None)
        if not isinstance(data, JOB_EVENTS) or job_id is None:
            return HolderChange(JobHolds())
        job = self.jobs.get(job_id, JobHolds())
        change = fold_holders(job, data, at, {g: self.holders.get(g) for g in gpus_involved(job, data)})
        self.jobs[job_id] = change.job
        for g in change.release:
            self.holders.pop(g, None)
        self.holders.update(change.hold)
        return change

    def holder(self, gpu: str) -> Holder | None:
        """Which attempt holds `gpu` now, if any."""
        return self.holders.get(gpu)
