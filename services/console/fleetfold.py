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
from whaleflux.shared.fleet_health import fleet_health, shown_status
from whaleflux.shared.gpu_flags import flags

from .heatmap import BUSY, STALE, cell_bits, cells_text, layout_text
from .models import FleetSummary, GpuJob, GpuRow

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
    cell: bytes  # its heat-map cell: utilization %, temperature % of the slowdown limit, flag bits (one byte each)

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
    cell = bytes((min(round(gpu.utilization_gpu_pct), 255), min(max(temp_pct, 0), 255),
                  cell_bits(found, stale=False, busy=False)))
    return GpuEntry(cluster, node, sample_time, ts, gpu, last_xid, found, cell)


@dataclass(frozen=True, slots=True)
class NodeLine:
    """A node as the fleet page's node table shows it (a plain record: 1,000 are made a second at 1,000 nodes)."""

    cluster: str
    node: str
    gpus: int
    model: str | None = None
    util_mean_pct: float | None = None
    power_w: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    stale: bool = False
    flagged_gpus: int = 0
    status: str = "unknown"  # the scheduler's word, `unknown` for `healthy` while its telemetry is silent


@dataclass(frozen=True, slots=True)
class NodeNumbers:
    """One node at one build: its table line, its heat-map text and its share of the fleet's totals."""

    key: tuple[object, ...]  # what it was built from, besides the samples (see NodeEntry.numbers)
    line: NodeLine
    layout: str  # its part of the heat map's layout: `[name, state, GPUs]`
    cells: bytes  # its heat-map cells, three bytes a GPU in index order
    stale: int
    with_job: int


@dataclass(frozen=True, slots=True)
class NodeSums:
    """What a node's samples add up to, worked out once per new sample (not per build)."""

    util: float
    power: float | None  # None: no GPU reports its power
    used: float
    total: float
    flagged: int
    hot: int
    throttled: int
    erroring: int


class NodeEntry:
    """One node's GPUs, each its newest sample, and its numbers as last built."""

    def __init__(self, cluster: str, node: str):
        self.cluster, self.node = cluster, node
        self.gpus: dict[str, GpuEntry] = {}
        self.version = 0  # bumped by every sample that changed something
        self._ordered: list[GpuEntry] = []
        self._sums: NodeSums | None = None
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

    def _summed(self) -> NodeSums:
        if self._sums is None:  # one pass over the GPUs: this runs for every node that sent a sample since
            gs = self._ordered = sorted(self.gpus.values(), key=_index)
            util = used = total = power = 0.0
            powered = flagged = hot = throttled = erroring = 0
            oldest = gs[0].ts
            for g in gs:
                s = g.gpu
                util += s.utilization_gpu_pct
                used += s.memory_used_mib
                total += s.memory_total_mib
                if s.power_w is not None:
                    power += s.power_w
                    powered += 1
                if g.ts < oldest:
                    oldest = g.ts
                if g.flags:
                    flagged += 1
                    hot += "hot" in g.flags
                    throttled += "throttled" in g.flags
                    erroring += not ERRORING.isdisjoint(g.flags)
            self._oldest = oldest
            self._sums = NodeSums(round(util / len(gs), 1), round(power, 1) if powered else None, round(used, 1),
                                  round(total, 1), flagged, hot, throttled, erroring)
        return self._sums

    def counts(self) -> tuple[float, int, int, int]:
        """Power (W, 0 where unknown), hot, throttled and erroring GPUs: what the fleet's totals add up."""
        sums = self._summed()
        return sums.power or 0.0, sums.hot, sums.throttled, sums.erroring

    def numbers(self, now: float, stale_after_s: float, held: Mapping[str, object], status: str | None) -> NodeNumbers:
        """This node's line and heat-map text at `now`, the same objects as last time if nothing they show changed;
        `status`: the scheduler's state of the node (None: it does not list it)."""
        sums = self._summed()
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
        flagged = sums.flagged
        if stale:
            flagged = sum(1 for i, g in enumerate(gs) if g.flags or stale_mask >> i & 1)
        shown = shown_status(status, silent=stale == len(gs))
        line = NodeLine(self.cluster, self.node, len(gs), gs[0].gpu.model, sums.util, sums.power, sums.used,
                        sums.total, stale == len(gs), flagged, shown)
        cells = b"".join(g.cell for g in gs)
        if stale_mask or busy_mask:  # the bits a build adds to what the samples said
            marked = bytearray(cells)
            for i in range(len(gs)):
                marked[3 * i + 2] |= (STALE if stale_mask >> i & 1 else 0) | (BUSY if busy_mask >> i & 1 else 0)
            cells = bytes(marked)
        layout = f"[{self._name},{_js(shown)},{len(gs)}]"
        self._built = NodeNumbers(key, line, layout, cells, stale, busy_mask.bit_count())
        return self._built


def _index(g: GpuEntry) -> int:
    return g.gpu.index


@dataclass(frozen=True)
class FleetNumbers:
    summary: FleetSummary
    nodes: list[NodeLine]  # sorted by cluster and node
    heat: str  # the heat map's layout, JSON: {"v": version, "gpus": N, "nodes": [[name, state, GPUs], ...]}
    cells: str  # its cells: "<version>:<base64 of 3 bytes a GPU, in layout order>"


def fleet_numbers(nodes: Iterable[NodeEntry], now: float, stale_after_s: float, held: Mapping[str, object],
                  statuses: Mapping[str, str]) -> FleetNumbers:
    """Every node's numbers and the fleet's totals; `nodes` in name order, `held`: GPUs a job holds,
    `statuses`: the scheduler's state per node (a node it does not list, or whose telemetry is silent, shows
    "unknown": shared/fleet_health.py)."""
    lines: list[NodeLine] = []
    layout: list[str] = []
    cells: list[bytes] = []
    gpus = stale = with_job = hot = throttled = erroring = 0
    power = 0.0
    for entry in nodes:
        if not entry.gpus:
            continue
        n = entry.numbers(now, stale_after_s, held, statuses.get(entry.node))
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
                                           throttled=throttled, erroring=erroring, with_job=with_job,
                                           health=fleet_health(gpus, stale, hot + throttled + erroring))
    lines.sort(key=lambda n: (n.cluster, n.node))
    heat, version = layout_text(layout, gpus)
    return FleetNumbers(summary, lines, heat, cells_text(version, cells))


def _js(text: str) -> str:
    """A JSON string, safe inside a <script> element whatever it holds."""
    return json.dumps(text).replace("<", "\\u003c")
