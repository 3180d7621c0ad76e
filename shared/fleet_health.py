"""One word for how a node or the fleet is doing, from what telemetry heard. Pure: counts in, a word out.

Silence is not health: a node whose every GPU is stale (no sample within the freshness window,
`WHALEFLUX_STALE_AFTER_S`) is `unknown`, and so is a fleet with no fresh sample at all. A view that
has its own word for a node (the scheduler's `healthy`, from heartbeats alone) shows `unknown` instead
of `healthy` while the node's telemetry is silent; a worse word (suspect, lost, draining) stays.
"""

from __future__ import annotations

from typing import Literal

Health = Literal["healthy", "degraded", "unknown"]
UNKNOWN: Health = "unknown"


def node_health(gpus: int, stale: int, flagged: int) -> Health:
    """`unknown` when none of its `gpus` reported within the window, `degraded` when one is flagged
    (stale, hot, throttled, erroring), `healthy` otherwise."""
    if gpus == 0 or stale >= gpus:
        return UNKNOWN
    return "degraded" if flagged else "healthy"


def fleet_health(gpus: int, stale: int, troubled: int) -> Health:
    """The fleet's word: `unknown` when no GPU reported within the window (or there is none), `degraded`
    when some are stale or in trouble (hot, throttled, erroring), `healthy` otherwise."""
    if gpus == 0 or stale >= gpus:
        return UNKNOWN
    return "degraded" if stale or troubled else "healthy"


def shown_status(status: str | None, silent: bool) -> str:
    """A node's status as a view shows it: the scheduler's `status` (None: it does not list the node),
    `unknown` in place of `healthy` while the node's telemetry is `silent`."""
    if status is None or (silent and status == "healthy"):
        return UNKNOWN
    return status
