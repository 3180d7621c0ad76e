"""The fleet heat map's cells: one small cell per GPU, grouped by node, for a canvas that stays readable at 8,000 GPUs.

A cell is `[utilization %, temperature as % of the slowdown limit, flag bits]`; the browser colours it
by the metric the user picks. Names go once per node, not per GPU, so the whole map is about 12 bytes
a GPU on the wire each second. The map's text is put together in `fleetfold.py`.
"""

from __future__ import annotations

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
