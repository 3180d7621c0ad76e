"""A placement's fencing token: a node never starts an attempt after its `start_by`. Pure (no I/O, no clock).

The scheduler requeues an attempt it never heard of only once a heartbeat the
node sent after `start_by` (by the node's own clock, the clock this check
reads) does not list it: by then the node has either started it (and lists
it) or will refuse it, so a frozen agent that wakes up runs nothing stale.
"""

from __future__ import annotations

from datetime import datetime

from whaleflux.shared.events import JobPlaced


def refusal(placed: JobPlaced, now: datetime) -> str | None:
    """Why the attempt must not start at `now` (the node's clock); None: it may start."""
    if placed.start_by is None or now <= placed.start_by:
        return None
    late_s = (now - placed.start_by).total_seconds()
    return (f"placement of attempt {placed.attempt} came {late_s:.1f} s after its start-by time"
            f" ({placed.start_by.isoformat()}): the scheduler may have placed the job again")
