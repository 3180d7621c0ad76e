"""Rebuild the scheduler's Redis state from JetStream after it was lost (the shell around `history.Fold`).

Starts from the latest snapshot (a fold of the JOBS stream up to some
sequence, kept in a JetStream object store), folds the stream's tail after it
up to its last sequence (the scheduler decides nothing meanwhile), writes the
records, the queue and the GPU allocations in a few pipelines, and moves the
`scheduler-jobs` consumer to just after what was folded, so nothing is applied
twice and nothing is missed. Nodes come back from their latest registration
(one per node, not the whole NODES stream) and the drains still asked for (not
undrained since); GPU quarantines from the cordons and uncordons on the
VALIDATIONS stream.

The leader refreshes the snapshot in the background (`snapshot`): the last
one plus the tail since, less the jobs that ended more than `keep_finished_s`
ago, so a rebuild's time grows with the live state and recent history, not
with every job ever run.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BucketNotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from whaleflux.shared import subjects as s
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import (
    Envelope,
    EventData,
    GpuCordoned,
    GpuUncordoned,
    InvalidEvent,
    NodeDrainRequested,
    NodeRegistered,
    NodeUndrained,
    decode_typed,
    misaddressed,
)
from whaleflux.shared.pull import Puller
from whaleflux.shared.streams import CONSUMERS, reports, submissions

from .history import Fold
from .records import ACTIVE, GpuQuarantine, NodeCondition
from .store import SchedulerStore

# What a job's history is made of (stop orders, job.preempted, change nothing in a record).
JOB_HISTORY = [*submissions(), f"{s.JOB_PLACED}.>", *reports(), s.JOB_REQUEUED, s.JOB_REJECTED, s.JOB_CANCELLED]
FETCH = 2000
SNAPSHOT_BUCKET = "WHALEFLUX_SCHEDULER_SNAPSHOTS"
SNAPSHOT_NAME = "jobs"


@dataclass(frozen=True)
class Rebuilt:
    jobs: int
    events: int
    pending: int
    active: int
    nodes: int
    last_seq: int


async def read_stream(bus: Bus, stream: str, filters: list[str], upto: int | None = None,
                      deliver: DeliverPolicy = DeliverPolicy.ALL,
                      after: int = 0) -> AsyncIterator[tuple[int, Envelope, EventData]]:
    """Every valid event of `stream` matching `filters`, in order, with its sequence: after sequence `after`,
    up to sequence `upto`, or until none is left."""
    info = await bus.js.stream_info(stream)
    last = info.state.last_seq if upto is None else upto
    if info.state.messages == 0 or last <= after:
        return
    if after:
        deliver = DeliverPolicy.BY_START_SEQUENCE
    name = f"rebuild-{secrets.token_hex(4)}"
    config = ConsumerConfig(
        name=name, deliver_policy=deliver, opt_start_seq=after + 1 if after else None, ack_policy=AckPolicy.NONE,
        inactive_threshold=60.0,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
    )
    await bus.js.add_consumer(stream, config)
    puller = Puller(bus.nc, stream, name)
    await puller.bind()
    try:
        pending = (await bus.js.consumer_info(stream, name)).num_pending
        while pending:
            msgs = await puller.fetch(min(FETCH, pending), timeout=5.0)
            if not msgs:
                pending = (await bus.js.consumer_info(stream, name)).num_pending
                continue
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if seq > last:
                    return
                try:
                    env, data = decode_typed(msg.data)
                    misaddressed(msg.subject, data)
                except InvalidEvent:
                    continue  # dead-lettered when it first arrived
                yield seq, env, data
            if msgs[-1].metadata.sequence.stream >= last:
                return
            pending = msgs[-1].metadata.num_pending  # what is left after the last one, as the server counted
    finally:
        await puller.unsubscribe()
        try:
            await bus.js.delete_consumer(stream, name)
        except nats.errors.Error:
            pass


async def snapshot_store(bus: Bus) -> ObjectStore:
    try:
        return await bus.js.object_store(SNAPSHOT_BUCKET)
    except BucketNotFoundError:
        return await bus.js.create_object_store(SNAPSHOT_BUCKET, replicas=bus.replicas,
                                                description="scheduler: job history folded up to a sequence")


async def folded(bus: Bus, hold_s: float, max_restarts: int, upto: int) -> tuple[Fold, int]:
    """The latest snapshot plus the JOBS stream's tail after it, up to `upto`; and how many events the tail had."""
    fold, seq = Fold(hold_s, max_restarts), 0
    try:
        blob = (await (await snapshot_store(bus)).get(SNAPSHOT_NAME)).data
        if blob is not None:
            fold, seq = Fold.load(blob, hold_s, max_restarts)
    except ObjectNotFoundError:
        pass
    first = (await bus.js.stream_info("WHALEFLUX_JOBS")).state.first_seq
    if seq and seq + 1 < first:
        # The stream no longer holds what followed the snapshot (aged out): the snapshot is all there is of it.
        seq = first - 1
    events = 0
    async for _seq, env, data in read_stream(bus, "WHALEFLUX_JOBS", JOB_HISTORY, upto, after=seq):
        fold.apply(env, data)
        events += 1
    return fold, events


async def snapshot(bus: Bus, hold_s: float, max_restarts: int, now: datetime,
                   keep_finished_s: float) -> tuple[int, int]:
    """Refresh the snapshot: the last one plus the tail since, less jobs ended more than `keep_finished_s` ago.
    Returns (sequence it is as of, jobs in it)."""
    upto = (await bus.js.stream_info("WHALEFLUX_JOBS")).state.last_seq
    fold, _ = await folded(bus, hold_s, max_restarts, upto)
    fold.forget_finished(now - timedelta(seconds=keep_finished_s))
    await (await snapshot_store(bus)).put(SNAPSHOT_NAME, fold.dump(upto))
    return upto, len(fold.jobs)


async def folded_quarantine(bus: Bus) -> tuple[dict[str, GpuQuarantine], dict[str, int]]:
    """The GPU quarantine as its events left it (every gpu.cordoned and gpu.uncordoned, in order): the GPUs still
    out, and the ECC errors operators accepted. A fault's hold counts afresh from the rebuild."""
    records: dict[str, GpuQuarantine] = {}
    accepted: dict[str, int] = {}
    async for _seq, env, data in read_stream(bus, "WHALEFLUX_VALIDATIONS", [f"{s.GPU_CORDONED}.>",
                                                                              f"{s.GPU_UNCORDONED}.>"]):
        if isinstance(data, GpuCordoned):
            records[data.gpu_uuid] = GpuQuarantine(cluster=data.cluster, node=data.node, uuid=data.gpu_uuid,
                                                   index=data.gpu_index, cause=data.cause, reason=data.reason,
                                                   since=env.time)
        elif isinstance(data, GpuUncordoned):
            records.pop(data.gpu_uuid, None)
            if data.by == "operator":
                accepted[data.gpu_uuid] = data.accepted_ecc_errors
    return records, accepted


async def rebuild(bus: Bus, store: SchedulerStore, hold_s: float, max_restarts: int, now: datetime) -> Rebuilt:
    """The latest snapshot, the JOBS stream's tail and the nodes' latest registrations, as a fresh scheduler state."""
    last_jobs = (await bus.js.stream_info("WHALEFLUX_JOBS")).state.last_seq
    fold, events = await folded(bus, hold_s, max_restarts, last_jobs)
    registrations: dict[str, NodeRegistered] = {}
    drains: dict[str, tuple[int, NodeDrainRequested]] = {}
    undrains: dict[str, int] = {}
    last_nodes = (await bus.js.stream_info("WHALEFLUX_NODES")).state.last_seq
    latest = [f"{s.NODE_REGISTERED}.>", f"{s.NODE_DRAIN_REQUESTED}.>", f"{s.NODE_UNDRAINED}.>"]
    async for seq, _env, data in read_stream(bus, "WHALEFLUX_NODES", latest, deliver=DeliverPolicy.LAST_PER_SUBJECT):
        if isinstance(data, NodeRegistered):
            registrations[f"{data.cluster}/{data.node}"] = data
        elif isinstance(data, NodeDrainRequested):
            drains[f"{data.cluster}/{data.node}"] = (seq, data)
        elif isinstance(data, NodeUndrained):
            undrains[f"{data.cluster}/{data.node}"] = seq
    quarantined, accepted = await folded_quarantine(bus)

    jobs = list(fold.jobs.values())
    for job in jobs:
        if job.state in ACTIVE and job.expected_end is None and job.spec.expected_runtime_s and job.placed_at:
            job.expected_end = job.placed_at.timestamp() + job.spec.expected_runtime_s
    # A drain asked for stays in force (its jobs moved when it was asked; the fold knows where to), unless the
    # node was undrained after it.
    conditions = {key: NodeCondition(state="draining", reason=d.reason, since=now)
                  for key, (seq, d) in drains.items() if seq > undrains.get(key, 0)}
    await store.replace_all(jobs, registrations, conditions)
    await store.replace_quarantines(quarantined, accepted)
    await bus.reposition_consumer(CONSUMERS["scheduler-jobs"], last_jobs + 1)
    await bus.reposition_consumer(CONSUMERS["scheduler-nodes"], last_nodes + 1)
    pending = sum(1 for j in jobs if j.state == "pending")
    active = sum(1 for j in jobs if j.state in ACTIVE)
    return Rebuilt(len(jobs), events, pending, active, len(registrations), last_jobs)
