"""What one job event changes in billing's ledger: the usage records of its attempt's parts and who
holds which GPU. Pure: the event and what the store holds in, the records and holder changes out.

The usage record of a part runs from `job.started` (`started_at`) to
`job.finished` / `job.failed`; a `job.requeued` ends the parts still running at
the requeue's time (the scheduler took the GPUs back: a lost node's agent never
reports the end), and an end the agent reports later replaces it. A
`job.started` replayed after the part's end changes nothing. Who holds a GPU is
the fold shared with inventory and telemetry (`shared.contracts.holders`).
Every change is keyed by (job, attempt, part), so a redelivered or replayed
event rewrites the same values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from whaleflux.shared.contracts import Holder, HolderChange, JobHolds, fold_holders
from whaleflux.shared.events import EventData, JobFailed, JobFinished, JobPlaced, JobRequeued, JobStarted
from whaleflux.shared.handlers import Reject, Retry

from .metering import UsageRecord, ledger_key
from .pricing import gpu_seconds


@dataclass(frozen=True)
class Span:
    """What one job event says about one part of an attempt's allocation."""

    job_id: str
    attempt: int
    rank: int
    state: str  # running | finished | failed | requeued
    started: datetime | None  # None for a requeue: the recorded start stands
    end: datetime | None  # None while running

    @cached_property
    def ledger(self) -> str:  # read four times per event: computed once
        return ledger_key(self.job_id, self.attempt, self.rank)


def spans(data: EventData, at: datetime) -> list[Span]:
    """The ledger changes a job event asks for (`at`: the event's time); none for other events.

    A requeue ends every part of a gang (`gang_nodes`), each with its own record.
    """
    if isinstance(data, JobStarted):
        return [Span(data.job_id, data.attempt, data.rank or 0, "running", data.started_at, None)]
    if isinstance(data, JobFinished):
        return [Span(data.job_id, data.attempt, data.rank or 0, "finished", data.started_at, data.finished_at)]
    if isinstance(data, JobFailed) and data.started_at is not None:
        return [Span(data.job_id, data.attempt, data.rank or 0, "failed", data.started_at, data.failed_at)]
    if isinstance(data, JobRequeued):
        return [Span(data.job_id, data.attempt, rank, "requeued", None, at)
                for rank in range(len(data.gang_nodes or ()) or 1)]
    return []


def report_ledger(data: EventData) -> str | None:
    """The ledger key of the part a node's report (job.started / finished / failed) is about; None for others."""
    if isinstance(data, (JobStarted, JobFinished, JobFailed)):
        return ledger_key(data.job_id, data.attempt, data.rank or 0)
    return None


def from_placed_node(data: EventData, placed: JobPlaced | None) -> str | None:
    """Why a node's report may not be applied (it names another node than its part was placed on: a node may
    send only its own nodes' reports, so this is a forgery or a mix-up), or None."""
    if placed is None or not isinstance(data, (JobStarted, JobFinished, JobFailed)):
        return None
    if (data.cluster, data.node) == (placed.cluster, placed.node):
        return None
    return (f"{data.event_name} from {data.cluster}/{data.node} for job {data.job_id} attempt {data.attempt}, "
            f"placed on {placed.cluster}/{placed.node}")


def interval_after(span: Span, current: UsageRecord | None) -> tuple[datetime, datetime | None] | None:
    """The (start, end) the part's record gets from `span` given the record kept; None when the event
    changes nothing."""
    if span.started is None:  # a requeue ends a running record; one never started ran nothing
        if current is None or current.ended_at is not None:
            return None
        return current.started_at, max(span.end or current.started_at, current.started_at)
    if span.end is None and current is not None and current.ended_at is not None:
        return None  # job.started replayed after its end: the ended record stands
    return span.started, span.end


def record_for(span: Span, placed: JobPlaced, started: datetime, end: datetime | None) -> UsageRecord:
    """The part's record over [started, end) (`interval_after`), tagged from its placement."""
    gpus = len(placed.gpu_uuids)
    # One validated model, its end included (not a running record copied with its end: once per job event).
    return UsageRecord(
        job_id=span.job_id, attempt=span.attempt, team=placed.team, project=placed.project,
        gpu_model=placed.gpu_model, gpus=gpus, node=placed.node, cluster=placed.cluster,
        gpu_uuids=placed.gpu_uuids, started_at=started, rank=span.rank,
        **({"state": "running"} if end is None else
           {"ended_at": end, "state": span.state, "gpu_seconds": gpu_seconds(started, end, gpus)}),
    )


@dataclass(frozen=True)
class JobEventState:
    """What the store holds that one job event's outcome depends on."""

    holds: JobHolds
    holders: Mapping[str, Holder | None]  # of `gpus_involved(holds, event)` at least
    usage: Mapping[str, UsageRecord | None] = field(default_factory=dict)  # per span's ledger key at least
    placements: Mapping[str, JobPlaced | None] = field(default_factory=dict)  # the same


@dataclass(frozen=True)
class JobEventOutcome:
    """What to write for one job event, all together; `missing`: why it cannot be applied yet."""

    holders: HolderChange
    records: tuple[UsageRecord, ...] = ()
    placement: tuple[str, JobPlaced] | None = None  # (ledger key, placement) to keep
    missing: str | None = None
    refused: str | None = None  # why it can never be applied (dead-lettered)


def job_event(data: EventData, at: datetime, state: JobEventState) -> JobEventOutcome:
    """The outcome of one job event (`at`: its envelope time) given what the store holds."""
    key = report_ledger(data)
    refused = from_placed_node(data, state.placements.get(key) if key is not None else None)
    if refused is not None:
        return JobEventOutcome(HolderChange(state.holds), refused=refused)
    change = fold_holders(state.holds, data, at, state.holders)
    if isinstance(data, JobPlaced):
        return JobEventOutcome(change, placement=(ledger_key(data.job_id, data.attempt, data.part), data))
    records = []
    for span in spans(data, at):
        interval = interval_after(span, state.usage.get(span.ledger))
        if interval is None:
            continue
        placed = state.placements.get(span.ledger)
        if placed is None:
            rank = f" rank {span.rank}" if span.rank else ""
            return JobEventOutcome(change, missing=f"no placement recorded for job {span.job_id} attempt "
                                                   f"{span.attempt}{rank}")
        records.append(record_for(span, placed, *interval))
    return JobEventOutcome(change, tuple(records))


_NO_HOLDS = JobHolds()  # a job the store holds nothing of (immutable: the fold makes new ones, shared safely)


@dataclass
class LedgerView:
    """What the store holds for a batch of job events (read once), changed in memory event by event; the
    `dirty_*` sets say what to write back, all together, after the batch."""

    holds: dict[str, JobHolds] = field(default_factory=dict)
    holders: dict[str, Holder | None] = field(default_factory=dict)
    usage: dict[str, UsageRecord | None] = field(default_factory=dict)
    placements: dict[str, JobPlaced | None] = field(default_factory=dict)
    dirty_holds: set[str] = field(default_factory=set)
    dirty_holders: set[str] = field(default_factory=set)
    dirty_usage: set[str] = field(default_factory=set)
    dirty_placements: set[str] = field(default_factory=set)
    unheld: frozenset[str] = frozenset()  # GPUs the store held no holder for when read: none to clear

    def state_for(self, data: EventData) -> JobEventState:
        """The view itself, seen from one event: `job_event` looks up only what the event involves (a key the
        view lacks reads as None, as it would in the store)."""
        return JobEventState(self.holds.get(getattr(data, "job_id", ""), _NO_HOLDS), self.holders, self.usage,
                             self.placements)

    def apply(self, job_id: str, outcome: JobEventOutcome) -> None:
        change = outcome.holders
        self.holds[job_id] = change.job
        self.dirty_holds.add(job_id)
        for g in change.release:
            self.holders[g] = None
        self.holders.update(change.hold)
        self.dirty_holders.update(change.release, change.hold)
        for record in outcome.records:
            self.usage[record.ledger_key] = record
            self.dirty_usage.add(record.ledger_key)
        if outcome.placement is not None:
            ledger, placed = outcome.placement
            self.placements[ledger] = placed
            self.dirty_placements.add(ledger)


def reads_for(events: list[tuple[EventData, datetime]]) -> tuple[list[str], list[str], list[str]]:
    """The jobs, GPUs and ledger keys a batch of job events reads (GPUs its events name; the store adds the
    GPUs the jobs' holds name)."""
    jobs: dict[str, None] = {}
    gpus: dict[str, None] = {}
    ledgers: dict[str, None] = {}
    for data, at in events:
        job_id = getattr(data, "job_id", None)
        if not isinstance(job_id, str):
            continue
        jobs[job_id] = None
        if isinstance(data, (JobPlaced, JobStarted)):
            gpus.update(dict.fromkeys(data.gpu_uuids))
        if isinstance(data, JobPlaced):
            ledgers[ledger_key(data.job_id, data.attempt, data.part)] = None
        elif (key := report_ledger(data)) is not None:  # a node's report: its one span's key
            ledgers[key] = None
        elif isinstance(data, JobRequeued):
            ledgers.update(dict.fromkeys(span.ledger for span in spans(data, at)))
    return list(jobs), list(gpus), list(ledgers)


def job_events(events: list[tuple[EventData, datetime]], view: LedgerView) -> list[Exception | None]:
    """Apply a batch of job events in stream order to `view`; per event None (applied, or not a job event),
    Retry (its placement is missing: retried later, the others stand) or Reject (from another node)."""
    out: list[Exception | None] = []
    for data, at in events:
        job_id = getattr(data, "job_id", None)
        if not isinstance(job_id, str):
            out.append(None)
            continue
        outcome = job_event(data, at, view.state_for(data))
        if outcome.missing is None and outcome.refused is None:
            view.apply(job_id, outcome)
        out.append(Retry(outcome.missing) if outcome.missing else Reject(outcome.refused) if outcome.refused else None)
    return out
