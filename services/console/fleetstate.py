"""The fleet as the console holds it: every GPU's latest sample folded from `gpu.telemetry` on the bus.

A view build reads no service for its GPUs: at 1,000 nodes x 8 GPUs, telemetry's `/v1/gpus`,
`/v1/nodes` and `/v1/fleet` take seconds each (every GPU's latest sample read and validated again),
while the samples are on the bus anyway. What a sample does not say, the job holding a GPU and the
XID it last reported, comes from telemetry's `/v1/gpus`, read in the background (parsed in a thread)
every `details_every_s` or ten times as long as the last read took (sooner after a job event), never
inside a build once anything is known. A console
that has heard nothing yet reads `/v1/gpus` once and waits for it, so its first page is complete.

The summaries (`summary`, `node_summaries`) are pure; the flags are the rule telemetry shows too
(`shared/gpu_flags.py`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby

from pydantic import TypeAdapter, ValidationError

from whaleflux.shared.events import GpuSample, GpuTelemetry, InvalidEvent, decode
from whaleflux.shared.gpu_flags import flags

from .models import FleetSummary, GpuJob, GpuRow, NodeStatus, NodeTelemetry
from .upstream import Upstream, UpstreamError

STALE_AFTER_S = 15.0  # telemetry's default `stale_after_s`
DETAILS_EVERY_S = 5.0
DETAILS_MIN_GAP_S = 1.0  # job events ask for a fresh read, at most this often
STATUSES_TTL_S = 2.0  # the scheduler's node states are read at most this often (a build every second)
_ROWS = TypeAdapter(list[GpuRow])
_STATUSES = TypeAdapter(list[NodeStatus])


@dataclass(frozen=True)
class Latest:
    cluster: str
    node: str
    sample_time: datetime
    gpu: GpuSample


def summary(rows: list[GpuRow]) -> FleetSummary:
    def count(flag: str) -> int:
        return sum(1 for r in rows if flag in r.flags)

    return FleetSummary.model_construct(
        gpus=len(rows), nodes=len({(r.cluster, r.node) for r in rows}),
        power_w=round(sum(r.gpu.power_w or 0.0 for r in rows), 1), stale=count("stale"), hot=count("hot"),
        throttled=count("throttled"), erroring=sum(1 for r in rows if {"xid", "ecc", "nvlink"} & set(r.flags)),
        with_job=sum(1 for r in rows if r.job),
    )


def node_summaries(rows: list[GpuRow]) -> list[NodeTelemetry]:
    """One line per node (rows sorted by node): mean utilization, power, memory, stale, flagged GPUs."""
    out = []
    for (cluster, node), group in groupby(rows, key=lambda r: (r.cluster, r.node)):
        gs = list(group)
        powers = [g.gpu.power_w for g in gs if g.gpu.power_w is not None]
        out.append(NodeTelemetry.model_construct(
            cluster=cluster, node=node, gpus=len(gs), model=gs[0].gpu.model,
            util_mean_pct=round(sum(g.gpu.utilization_gpu_pct for g in gs) / len(gs), 1),
            power_w=round(sum(powers), 1) if powers else None,
            memory_used_mib=round(sum(g.gpu.memory_used_mib for g in gs), 1),
            memory_total_mib=round(sum(g.gpu.memory_total_mib for g in gs), 1),
            stale=all(g.stale for g in gs), flagged_gpus=sum(1 for g in gs if g.flags),
        ))
    return sorted(out, key=lambda n: (n.cluster, n.node))


class FleetState:
    def __init__(self, upstream: Upstream, details_every_s: float = DETAILS_EVERY_S,
                 stale_after_s: float = STALE_AFTER_S):
        self.upstream = upstream
        self.details_floor_s = self.details_every_s = details_every_s
        self.stale_after_s = stale_after_s
        self.samples: dict[str, Latest] = {}
        self.xids: dict[str, int] = {}  # the last XID heard on the bus, per GPU
        self.details: dict[str, GpuRow] = {}
        self.details_at = 0.0  # monotonic time of the last read of /v1/gpus (0: never)
        self.details_error: str | None = None
        self.details_due = False
        self.ignored = 0  # messages on gpu.telemetry that are not valid telemetry (telemetry dead-letters them)
        self._refresh: asyncio.Task[None] | None = None
        # Each GPU's row as last built, and what it was built from: most GPUs did not change since the last build.
        self._built: dict[str, tuple[tuple[object, ...], GpuRow]] = {}
        self._statuses: tuple[float, list[NodeStatus]] | None = None

    # ----------------------------------------------------------------- in

    def on_telemetry(self, raw: bytes) -> None:
        """One `gpu.telemetry` message from the bus: each GPU's sample kept if it is the newest."""
        try:
            _, event = decode(raw)
        except InvalidEvent:
            self.ignored += 1
            return
        if not isinstance(event, GpuTelemetry):
            self.ignored += 1
            return
        for g in event.gpus:
            cur = self.samples.get(g.uuid)
            if cur is None or cur.sample_time <= event.sample_time:
                self.samples[g.uuid] = Latest(event.cluster, event.node, event.sample_time, g)
            if g.xid_errors:
                self.xids[g.uuid] = g.xid_errors[-1]

    def on_job_event(self) -> None:
        """A job was placed or ended somewhere: who holds which GPU is read again soon."""
        self.details_due = True

    # ----------------------------------------------------------------- out

    async def rows(self, node: str | None = None) -> tuple[list[GpuRow], list[str]]:
        """Every GPU now (or one node's), sorted by node and index, and what could not be read."""
        await self._details()
        now = datetime.now(UTC)
        out = []
        for uuid in self.samples.keys() | self.details.keys():
            row = self._row(uuid, now)
            if node is None or row.node == node:
                out.append(row)
        out.sort(key=lambda r: (r.node, r.gpu.index))
        return out, [self.details_error] if self.details_error else []

    def _row(self, uuid: str, now: datetime) -> GpuRow:
        known, heard = self.details.get(uuid), self.samples.get(uuid)
        if known is not None and (heard is None or known.sample_time > heard.sample_time):
            heard = Latest(known.cluster, known.node, known.sample_time, known.gpu)
        if heard is None:
            raise KeyError(uuid)  # neither heard nor read: not a GPU of this fleet
        last_xid = self.xids.get(uuid) or (known.last_xid if known else None)
        age = (now - heard.sample_time).total_seconds()
        stale = age > self.stale_after_s
        job: GpuJob | None = known.job if known else None
        key = (heard.sample_time, heard.node, stale, last_xid, job)
        built = self._built.get(uuid)
        if built is not None and built[0] == key:
            return built[1]  # its age as of when it last changed (no page shows it)
        row = GpuRow.model_construct(cluster=heard.cluster, node=heard.node, sample_time=heard.sample_time,
                                     gpu=heard.gpu, age_s=round(age, 3), stale=stale,
                                     flags=flags(heard.gpu, last_xid, stale), last_xid=last_xid, job=job)
        self._built[uuid] = (key, row)
        return row

    async def node_statuses(self) -> list[NodeStatus]:
        """The scheduler's `/v1/nodes` (state, free GPUs), at most `STATUSES_TTL_S` old."""
        now = time.monotonic()
        if self._statuses is None or now - self._statuses[0] >= STATUSES_TTL_S:
            self._statuses = (now, _STATUSES.validate_python(await self.upstream.get("scheduler", "/v1/nodes")))
        return self._statuses[1]

    async def _details(self) -> None:
        if not self.samples and not self.details_at:
            await self._read_details()  # nothing known yet: the first page waits for telemetry once
            return
        since = time.monotonic() - self.details_at
        due = since >= self.details_every_s or (self.details_due and since >= DETAILS_MIN_GAP_S)
        if due and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self._read_details(), name="fleet-details")

    async def _read_details(self) -> None:
        self.details_due = False
        started = time.monotonic()
        try:
            body = (await self.upstream.raw("telemetry", "/v1/gpus")).content
            # 8,000 GPUs are 8 MB: read in a thread, so that views and pages go on meanwhile.
            rows = await asyncio.to_thread(_ROWS.validate_json, body)
        except (UpstreamError, ValidationError) as exc:
            self.details_error = str(exc) if isinstance(exc, UpstreamError) else f"telemetry: unexpected answer: {exc}"
        else:
            self.details = {r.gpu.uuid: r for r in rows}
            self.details_error = None
        finally:
            self.details_at = time.monotonic()
            # A large fleet's read takes seconds: it is made at most a tenth of the time.
            self.details_every_s = max(self.details_floor_s, 10 * (self.details_at - started))
