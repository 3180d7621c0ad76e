"""The fleet as the console holds it: every GPU's latest sample and the job holding it, folded from the bus.

A view build reads no service for its GPUs: at 1,000 nodes x 8 GPUs, telemetry's `/v1/gpus` takes
seconds (every GPU's latest sample read and validated again), while the samples are on the bus anyway.
`gpu.telemetry` gives each GPU's newest sample (and the XIDs it reports); `job.*` gives who holds which
GPU, through the same fold telemetry, billing and inventory use (`shared/contracts/holders.py`), so a
job shows on its GPUs as soon as it is placed, not at the next read of telemetry.

What the bus said before the console started comes from telemetry's `/v1/gpus`: read once before the
first page (that page waits for it), then in the background (parsed in a thread) every
`details_every_s`, or ten times as long as the last read took, to mend what a reconnect may have
missed. A GPU's holder from the bus always wins over that read's; a job whose end the console heard
holds nothing, whatever an older read says.

The scheduler's node states (`/v1/nodes`) are read at most every `STATUSES_TTL_S`, in the background
once one answer is known, so that no build waits for them.
"""

from __future__ import annotations

import asyncio
import json
import time

from pydantic import TypeAdapter

from whaleflux.shared.contracts.holders import GpuHolders
from whaleflux.shared.events import (
    GpuTelemetry,
    InvalidEvent,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRequeued,
    JobSubmitted,
    decode_typed,
    misaddressed,
)

from .fleetfold import FleetNumbers, NodeEntry, fleet_numbers, gpu_entry
from .models import GpuJob, GpuRow, NodeStatus
from .upstream import Upstream, UpstreamError, as_console

STALE_AFTER_S = 15.0  # telemetry's default `stale_after_s`
DETAILS_EVERY_S = 60.0
DETAILS_RETRY_S = 5.0  # after a failed read
STATUSES_TTL_S = 2.0  # the scheduler's node states are read at most this often (a build every second)
JOBS_KEPT = 100_000  # names and teams of this many recent jobs are remembered for the GPUs they hold
_ROWS = TypeAdapter(list[GpuRow])
PARSE_CHUNK = 200  # rows of telemetry's /v1/gpus validated in one call (parse_rows)
_STATUSES = TypeAdapter(list[NodeStatus])


class FleetState:
    def __init__(self, upstream: Upstream, details_every_s: float = DETAILS_EVERY_S,
                 stale_after_s: float = STALE_AFTER_S):
        self.upstream = upstream
        self.details_floor_s = self.details_every_s = details_every_s
        self.stale_after_s = stale_after_s
        self.nodes: dict[str, NodeEntry] = {}
        self._order: list[NodeEntry] | None = None  # the nodes in name order, until a node is added
        self.node_of: dict[str, str] = {}  # GPU uuid -> node
        self.xids: dict[str, int] = {}  # the last XID heard on the bus (or read), per GPU
        self.ignored = 0  # messages on gpu.telemetry that are not valid telemetry (telemetry dead-letters them)
        # Who holds which GPU: the bus's fold, and telemetry's answer for GPUs the bus has said nothing of.
        self.holders = GpuHolders()
        self.heard: set[str] = set()  # GPUs whose holder the bus has set or released
        # Jobs whose end (or requeue) the bus told: (job, node) for a gang's part, (job, None) for the whole job.
        self.ended: set[tuple[str, str | None]] = set()
        self.read_jobs: dict[str, GpuJob] = {}  # GPU -> job, as telemetry last answered
        self.job_meta: dict[str, GpuJob] = {}  # job -> its name, team, project (job.submitted, job.placed)
        self.held: dict[str, GpuJob] = {}  # GPU -> the job holding it now: both of the above
        self.details_at = 0.0  # monotonic time of the last read of /v1/gpus (0: never)
        self.details_error: str | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._statuses: tuple[float, list[NodeStatus]] | None = None
        self._statuses_task: asyncio.Task[None] | None = None
        self.statuses_error: str | None = None

    # ----------------------------------------------------------------- in

    def on_telemetry(self, raw: bytes, subject: str | None = None) -> None:
        """One `gpu.telemetry` message from the bus: each GPU's sample kept if it is the newest. One whose data
        names another node than its `subject` is ignored, as the services dead-letter it."""
        try:
            _, event = decode_typed(raw)  # the model as it is; no dict of it is made
            if subject is not None:
                misaddressed(subject, event)
        except InvalidEvent:
            self.ignored += 1
            return
        if not isinstance(event, GpuTelemetry):
            self.ignored += 1
            return
        entry = self._node(event.cluster, event.node)
        ts = event.sample_time.timestamp()
        for g in event.gpus:
            if g.xid_errors:
                self.xids[g.uuid] = g.xid_errors[-1]
            entry.put(gpu_entry(event.cluster, event.node, event.sample_time, ts, g, self.xids.get(g.uuid)))
            self.node_of[g.uuid] = event.node

    def _node(self, cluster: str, node: str) -> NodeEntry:
        entry = self.nodes.get(node)
        if entry is None:
            entry = self.nodes[node] = NodeEntry(cluster, node)
            self._order = None
        return entry

    def on_job(self, raw: bytes, subject: str | None = None) -> None:
        """One `job.*` message from the bus: the GPUs it holds or releases show it at the next build (not one whose
        data names another node than its `subject`)."""
        try:
            env, data = decode_typed(raw)
            if subject is not None:
                misaddressed(subject, data)
        except InvalidEvent:
            return
        if isinstance(data, JobSubmitted):
            self._remember(GpuJob.model_construct(job_id=data.job_id, name=data.name, team=data.team,
                                                  project=data.project))
        elif isinstance(data, JobPlaced):
            known = self.job_meta.get(data.job_id)
            self._remember(GpuJob.model_construct(job_id=data.job_id, name=known.name if known else None,
                                                  team=data.team, project=data.project))
        change = self.holders.apply(data, env.time)
        touched = {*change.hold, *change.release}
        self.heard |= touched
        if isinstance(data, JobFinished | JobFailed | JobRequeued):
            part = data.node if not isinstance(data, JobRequeued) and data.rank is not None else None
            self.ended.add((data.job_id, part))
            touched |= {g for g, job in self.read_jobs.items() if job.job_id == data.job_id}
        for g in touched:
            self._settle(g)

    def _remember(self, job: GpuJob) -> None:
        self.job_meta.pop(job.job_id, None)
        self.job_meta[job.job_id] = job
        if len(self.job_meta) > JOBS_KEPT:
            del self.job_meta[next(iter(self.job_meta))]

    def _settle(self, gpu: str) -> None:
        """Who holds `gpu` now: the bus's holder where the bus spoke of it, else telemetry's unless it ended."""
        job: GpuJob | None
        if gpu in self.heard:
            holder = self.holders.holder(gpu)
            job = None
            if holder is not None:
                read = self.read_jobs.get(gpu)
                job = self.job_meta.get(holder.job_id) or (
                    read if read and read.job_id == holder.job_id else GpuJob.model_construct(job_id=holder.job_id))
        else:
            job = self.read_jobs.get(gpu)
            if job is not None and {(job.job_id, None), (job.job_id, self.node_of.get(gpu))} & self.ended:
                job = None
        if job is None:
            self.held.pop(gpu, None)
        else:
            self.held[gpu] = job

    # ----------------------------------------------------------------- out

    async def ready(self) -> list[str]:
        """Telemetry read once before anything is shown, then again in the background when due;
        what could not be read."""
        if not self.details_at:
            await self._read_details()  # nothing known yet: the first page waits for telemetry once
        elif time.monotonic() - self.details_at >= self.details_every_s and (
                self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self._read_details(), name="fleet-details")
        return [self.details_error] if self.details_error else []

    def ordered(self) -> list[NodeEntry]:
        if self._order is None:
            self._order = [self.nodes[n] for n in sorted(self.nodes)]
        return self._order

    def numbers(self, statuses: dict[str, str]) -> FleetNumbers:
        """The fleet page's node lines, totals and heat map now."""
        return fleet_numbers(self.ordered(), time.time(), self.stale_after_s, self.held, statuses)

    def rows(self, node: str | None = None) -> list[GpuRow]:
        """Every GPU now (or one node's) as the GPU tables show it, sorted by node and index."""
        now = time.time()
        if node is None:
            entries = self.ordered()
        else:
            entries = [self.nodes[node]] if node in self.nodes else []
        return [g.row(now, self.stale_after_s, self.held.get(g.gpu.uuid)) for e in entries for g in e.ordered()]

    async def node_statuses(self) -> list[NodeStatus]:
        """The scheduler's `/v1/nodes` (state, free GPUs), at most `STATUSES_TTL_S` old once known; the
        first call waits for it, later ones get the last answer while a fresh one is read."""
        if self._statuses is None:
            await self._read_statuses()
        elif time.monotonic() - self._statuses[0] >= STATUSES_TTL_S and (
                self._statuses_task is None or self._statuses_task.done()):
            self._statuses_task = asyncio.create_task(self._read_statuses(), name="fleet-statuses")
        if self._statuses is None:
            raise UpstreamError("scheduler", self.statuses_error or "no answer")
        if self.statuses_error:
            raise UpstreamError("scheduler", self.statuses_error)
        return self._statuses[1]

    async def _read_statuses(self) -> None:
        try:
            with as_console():  # one read shared by every page: the console's own credential
                got = _STATUSES.validate_python(await self.upstream.get("scheduler", "/v1/nodes"))
        except UpstreamError as exc:
            self.statuses_error = exc.detail
            if self._statuses is not None:  # tried again after STATUSES_TTL_S, not at every build
                self._statuses = (time.monotonic(), self._statuses[1])
            return
        self.statuses_error = None
        self._statuses = (time.monotonic(), got)

    async def _read_details(self) -> None:
        started = time.monotonic()
        try:
            with as_console():
                body = (await self.upstream.raw("telemetry", "/v1/gpus")).content
            # 8,000 GPUs are 8 MB: read in a thread, so that views and pages go on meanwhile.
            rows = await asyncio.to_thread(parse_rows, body)
        except (UpstreamError, ValueError) as exc:  # ValueError: not JSON, or a ValidationError
            self.details_error = str(exc) if isinstance(exc, UpstreamError) else f"telemetry: unexpected answer: {exc}"
        else:
            self._take_details(rows)
            self.details_error = None
        finally:
            self.details_at = time.monotonic()
            # A large fleet's read takes seconds: it is made at most a tenth of the time.
            self.details_every_s = max(self.details_floor_s, 10 * (self.details_at - started))
            if self.details_error:
                self.details_every_s = min(self.details_every_s, DETAILS_RETRY_S)

    def _take_details(self, rows: list[GpuRow]) -> None:
        for r in rows:
            uuid = r.gpu.uuid
            if r.last_xid and uuid not in self.xids:
                self.xids[uuid] = r.last_xid
            self._node(r.cluster, r.node).put(
                gpu_entry(r.cluster, r.node, r.sample_time, r.sample_time.timestamp(), r.gpu, self.xids.get(uuid)))
            self.node_of[uuid] = r.node
        before = set(self.read_jobs)
        self.read_jobs = {r.gpu.uuid: r.job for r in rows if r.job is not None}
        held_read = {j.job_id for j in self.read_jobs.values()}
        self.ended = {e for e in self.ended if e[0] in held_read}  # an end matters while a read still shows the job
        for g in before | set(self.read_jobs):
            self._settle(g)


def parse_rows(body: bytes, chunk: int = PARSE_CHUNK) -> list[GpuRow]:
    """Telemetry's `/v1/gpus`, validated `chunk` rows at a time, letting other threads run in between.

    One validation call over 8 MB holds the GIL until it is done: on a busy machine that is many seconds
    in which the event loop cannot read from NATS, and nats-server drops a client that has not read for
    10 s (a slow consumer); between chunks the loop gets the GIL back."""
    items = json.loads(body)
    if not isinstance(items, list):
        return _ROWS.validate_python(items)  # raises, naming what it got
    rows: list[GpuRow] = []
    for start in range(0, len(items), chunk):
        rows += _ROWS.validate_python(items[start:start + chunk])
        time.sleep(0)  # hand the GIL over
    return rows

