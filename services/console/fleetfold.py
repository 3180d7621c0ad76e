"""The fleet page's numbers from each GPU's latest sample: node lines, fleet totals, the heat map. Pure (no I/O).

Made for 1,000 nodes x 8 GPUs at one build a second on a busy machine. What a sample says (its flags,
its heat-map cell, its node's sums) is worked out once, when the sample arrives (`NodeEntry.put`). A
build (`fleet_numbers`) adds only what changes without a new sample: whether a GPU went stale, which
GPUs a job holds, the scheduler's state of the node. A node whose samples and those three did not
change since the last build gives back the same line and heat-map text it gave then, so a build is a
few dictionary reads per node, not a model and a JSON encoding per GPU.

The flags are the rule telemetry shows too (`shared/gpu_flags.py`); a GPU's heat-map cell is
`[utilization %, temperature as % of the slowdown limit, flag bits]` (bits in `heatmap.py`), three bytes on
the wire (`heatmap.cells_text`); the map's layout (node names, states, GPU counts) goes apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from whaleflux.shared.events import GpuSample
from whaleflux.shared.gpu_flags import flags

from .heatmap import BUSY, STALE, cell_bits, cells_text, layout_text
from .models import FleetSummary, GpuJob, GpuRow, NodeTelemetry

ERRORING = frozenset({"xid", "ecc", "nvlink"})


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """One GPU's latest sample and what it says on its own (flags and heat-map cell, stale left out)."""

    cluster: str
    node: str
    sample_time: datetime
    ts: float  # sample_time as epoch seconds
    gpu: GpuSample
    last_xid: int | None
    flags: tuple[str, ...]
    cell: tuple[int, int, int]

    def stale(self, now: float, stale_after_s: float) -> bool:
        return now - self.ts > stale_after_s

    def row(self, now: float, stale_after_s: float, job: GpuJob | None) -> GpuRow:
        """The GPU as the GPU tables show it (telemetry's `/v1/gpus` shape)."""
        stale = self.stale(now, stale_after_s)
        return GpuRow.model_construct(
            cluster=self.cluster, node=self.node, sample_time=self.sample_time, gpu=self.gpu,
            age_s=round(now - self.ts, 3), stale=stale, flags=["stale", *self.flags] if stale else list(self.flags),
            last_xid=self.last_xid, job=job)


def gpu_entry(cluster: str, node: str, sample_time: datetime, ts: float, gpu: GpuSample,
              last_xid: int | None) -> GpuEntry:
    """`ts`: `sample_time` as epoch seconds (one message's GPUs share it)."""
    found = tuple(flags(gpu, last_xid, stale=False))
    limit = gpu.slowdown_temperature_c
    temp_pct = round(100 * gpu.temperature_c / limit) if limit else 0
    cell = (round(gpu.utilization_gpu_pct), temp_pct, cell_bits(found, stale=False, busy=False))
    return GpuEntry(cluster, node, sample_time, ts, gpu, last_xid, found, cell)


@dataclass(frozen=True, slots=True)
class NodeNumbers:
    """One node at one build: its table line, its heat-map text and its share of the fleet's totals."""

    key: tuple[object, ...]  # what it was built from, besides the samples (see NodeEntry.numbers)
    line: NodeTelemetry
    layout: str  # its part of the heat map's layout: `[name, state, GPUs]`
    cells: bytes  # its heat-map cells, three bytes a GPU in index order
    stale: int
    with_job: int


class NodeEntry:
    """One node's GPUs, each its newest sample, and its numbers as last built."""

    def __init__(self, cluster: str, node: str):
        self.cluster, self.node = cluster, node
        self.gpus: dict[str, GpuEntry] = {}
        self.version = 0  # bumped by every sample that changed something
        self._ordered: list[GpuEntry] = []
        self._sums: tuple[float, float | None, float, float, int, int, int, int] | None = None
        self._oldest = 0.0
        self._built: NodeNumbers | None = None
        self._name = _js(node)

    def put(self, entry: GpuEntry) -> bool:
        """Keep `entry` if it is its GPU's newest sample; True when it was kept."""
        cur = self.gpus.get(entry.gpu.uuid)
        if cur is not None and cur.ts >= entry.ts:
            return False  # older, or the same sample again
        if entry.cluster != self.cluster:
            self.cluster = entry.cluster
        self.gpus[entry.gpu.uuid] = entry
        self.version += 1
        self._sums = None
        return True

    def ordered(self) -> list[GpuEntry]:
        """The GPUs in index order."""
        self._summed()
        return self._ordered

    def _summed(self) -> tuple[float, float | None, float, float, int, int, int, int]:
        if self._sums is None:
            gs = self._ordered = sorted(self.gpus.values(), key=lambda g: g.gpu.index)
            powers = [g.gpu.power_w for g in gs if g.gpu.power_w is not None]
            self._oldest = min(g.ts for g in gs)
            self._sums = (
                round(sum(g.gpu.utilization_gpu_pct for g in gs) / len(gs), 1),
                round(sum(powers), 1) if powers else None,
                round(sum(g.gpu.memory_used_mib for g in gs), 1),
                round(sum(g.gpu.memory_total_mib for g in gs), 1),
                sum(1 for g in gs if g.flags),
                sum(1 for g in gs if "hot" in g.flags),
                sum(1 for g in gs if "throttled" in g.flags),
                sum(1 for g in gs if ERRORING.intersection(g.flags)),
            )
        return self._sums

    def counts(self) -> tuple[float, int, int, int]:
        """Power (W, 0 where unknown), hot, throttled and erroring GPUs: what the fleet's totals add up."""
        sums = self._summed()
        return sums[1] or 0.0, sums[5], sums[6], sums[7]

    def numbers(self, now: float, stale_after_s: float, held: Mapping[str, object], status: str) -> NodeNumbers:
        """This node's line and heat-map text at `now`, the same objects as last time if nothing they show changed."""
        util, power, used, total, flagged, _, _, _ = self._summed()
        gs = self._ordered
        stale_mask = busy_mask = 0
        if now - self._oldest > stale_after_s:
            for i, g in enumerate(gs):
                if g.stale(now, stale_after_s):
                    stale_mask |= 1 << i
        for i, g in enumerate(gs):
            if g.gpu.uuid in held:
                busy_mask |= 1 << i
        key = (self.version, stale_mask, busy_mask, status)
        if self._built is not None and self._built.key == key:
            return self._built
        stale = stale_mask.bit_count()
        if stale:
            flagged = sum(1 for i, g in enumerate(gs) if g.flags or stale_mask >> i & 1)
        line = NodeTelemetry.model_construct(
            cluster=self.cluster, node=self.node, gpus=len(gs), model=gs[0].gpu.model, util_mean_pct=util,
            power_w=power, memory_used_mib=used, memory_total_mib=total, stale=stale == len(gs), flagged_gpus=flagged)
        cells = bytearray()
        for i, g in enumerate(gs):
            u, t, b = g.cell
            cells += bytes((min(u, 255), min(max(t, 0), 255),
                            b | (STALE if stale_mask >> i & 1 else 0) | (BUSY if busy_mask >> i & 1 else 0)))
        layout = f"[{self._name},{_js(status)},{len(gs)}]"
        self._built = NodeNumbers(key, line, layout, bytes(cells), stale, busy_mask.bit_count())
        return self._built


@dataclass(frozen=True)
class FleetNumbers:
    summary: FleetSummary
    nodes: list[NodeTelemetry]  # sorted by cluster and node
    heat: str  # the heat map's layout, JSON: {"v": version, "gpus": N, "nodes": [[name, state, GPUs], ...]}
    cells: str  # its cells: "<version>:<base64 of 3 bytes a GPU, in layout order>"


def fleet_numbers(nodes: Iterable[NodeEntry], now: float, stale_after_s: float, held: Mapping[str, object],
                  statuses: Mapping[str, str]) -> FleetNumbers:
    """Every node's numbers and the fleet's totals; `nodes` in name order, `held`: GPUs a job holds,
    `statuses`: the scheduler's state per node ("unknown" for a node it does not list)."""
    lines: list[NodeTelemetry] = []
    layout: list[str] = []
    cells: list[bytes] = []
    gpus = stale = with_job = hot = throttled = erroring = 0
    power = 0.0
    for entry in nodes:
        if not entry.gpus:
            continue
        n = entry.numbers(now, stale_after_s, held, statuses.get(entry.node, "unknown"))
        lines.append(n.line)
        layout.append(n.layout)
        cells.append(n.cells)
        p, h, t, e = entry.counts()
        gpus += n.line.gpus
        stale += n.stale
        with_job += n.with_job
        power += p
        hot, throttled, erroring = hot + h, throttled + t, erroring + e
    summary = FleetSummary.model_construct(gpus=gpus, nodes=len(lines), power_w=round(power, 1), stale=stale, hot=hot,
                                           throttled=throttled, erroring=erroring, with_job=with_job)
    lines.sort(key=lambda n: (n.cluster, n.node))
    heat, version = layout_text(layout, gpus)
    return FleetNumbers(summary, lines, heat, cells_text(version, cells))


def _js(text: str) -> str:
    """A JSON string, safe inside a <script> element whatever it holds."""
    return json.dumps(text).replace("<", "\\u003c")
