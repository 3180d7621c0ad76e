"""The tail of a job's output, read where the agent writes it (`<home>/jobs/<job>.<attempt>.log`).

Only on the machine that runs the agent (`whaleflux up`): the agent serves no logs over HTTP yet.
"""

from __future__ import annotations

from pathlib import Path

TAIL_BYTES = 16 * 1024


def log_tail(home: Path, job_id: str, attempt: int, limit: int = TAIL_BYTES) -> str | None:
    """The last `limit` bytes of the attempt's log (from a line start), or None when there is none here."""
    if not job_id.replace("-", "").replace("_", "").replace(".", "").isalnum() or attempt < 1:
        return None
    path = home / "jobs" / f"{job_id}.{attempt}.log"
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - limit))
            data = fh.read()
    except FileNotFoundError:
        return None
    if size > limit and b"\n" in data:
        data = data[data.index(b"\n") + 1:]
    return data.decode(errors="replace")
