"""The fleet heat map's cells: one small cell per GPU, grouped by node, for a canvas that stays readable at 8,000 GPUs.

A cell is `[utilization %, temperature as % of the slowdown limit, flag bits]`; the browser colours it
by the metric the user picks. On the wire the map is two texts (`static/heatmap.js` reads them):
- the layout, JSON `{"v": version, "gpus": N, "nodes": [[name, state, GPUs], ...]}`, which changes only
  when a node comes or goes or changes state (the live view sends it only then);
- the cells, `"<version>:<base64>"`, three bytes a GPU in the layout's order (4 characters a GPU each
  second: 32 kB at 8,000 GPUs, decoded without a JSON parse); the version ties them to their layout.
The per-node parts are put together in `fleetfold.py`.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable

STALE, HOT, THROTTLED, ERROR, BUSY = 1, 2, 4, 8, 16
ERROR_FLAGS = frozenset({"xid", "ecc", "nvlink", "row_remap"})
# Scheduler node states that keep new work off a node.
QUARANTINED = {"draining", "lost", "suspect"}


def cell_bits(flags: Iterable[str], stale: bool, busy: bool) -> int:
    """A cell's flag bits from the GPU's flags, whether it is stale and whether a job holds it."""
    found = set(flags)
    bits = STALE if stale or "stale" in found else 0
    if "hot" in found:
        bits |= HOT
    if "throttled" in found:
        bits |= THROTTLED
    if found & ERROR_FLAGS:
        bits |= ERROR
    if busy:
        bits |= BUSY
    return bits


def layout_text(nodes: list[str], gpus: int) -> tuple[str, int]:
    """The layout's JSON from each node's `[name, state, GPUs]` text, and its version (a checksum of them)."""
    body = "[" + ",".join(nodes) + "]"
    version = zlib.crc32(body.encode())
    return f'{{"v":{version},"gpus":{gpus},"nodes":{body}}}', version


def cells_text(version: int, cells: Iterable[bytes]) -> str:
    return f"{version}:{base64.b64encode(b''.join(cells)).decode('ascii')}"


def decode_cells(text: str) -> tuple[int, list[tuple[int, int, int]]]:
    """What `heatmap.js` reads from a cells text: its layout version and each GPU's cell (tests, benches)."""
    version, _, data = text.partition(":")
    raw = base64.b64decode(data)
    return int(version), [(raw[i], raw[i + 1], raw[i + 2]) for i in range(0, len(raw), 3)]
