"""The fleet heat map's data: one small cell per GPU, grouped by node, for a canvas that stays readable at 8,000 GPUs.

A cell is `[utilization %, temperature as % of the slowdown limit, flag bits]`; the browser colours it
by the metric the user picks. Names go once per node, not per GPU, so the whole map is about 12 bytes
a GPU on the wire each second.
"""

from __future__ import annotations

import json
from itertools import groupby

from .models import GpuRow, NodeStatus

STALE, HOT, THROTTLED, ERROR, BUSY = 1, 2, 4, 8, 16
ERROR_FLAGS = {"xid", "ecc", "nvlink", "row_remap"}
# Scheduler node states that keep new work off a node.
QUARANTINED = {"draining", "lost", "suspect"}


def cell_flags(row: GpuRow) -> int:
    flags = set(row.flags)
    bits = 0
    if row.stale:
        bits |= STALE
    if "hot" in flags:
        bits |= HOT
    if "throttled" in flags:
        bits |= THROTTLED
    if flags & ERROR_FLAGS:
        bits |= ERROR
    if row.job is not None:
        bits |= BUSY
    return bits


def heat_cells(rows: list[GpuRow], statuses: dict[str, NodeStatus]) -> dict:
    """Nodes in name order, each `[name, scheduler status, [cell, ...]]` in GPU index order."""
    ordered = sorted(rows, key=lambda r: (r.node, r.gpu.index))
    nodes = []
    for node, gpus in groupby(ordered, key=lambda r: r.node):
        cells = [[round(g.gpu.utilization_gpu_pct), round(100 * g.temp_ratio) if g.temp_ratio else 0, cell_flags(g)]
                 for g in gpus]
        status = statuses[node].status if node in statuses else "unknown"
        nodes.append([node, status, cells])
    return {"nodes": nodes, "gpus": len(ordered)}


def heat_json(rows: list[GpuRow], statuses: dict[str, NodeStatus]) -> str:
    # Safe inside a <script> element whatever a name holds.
    return json.dumps(heat_cells(rows, statuses), separators=(",", ":")).replace("<", "\\u003c")
