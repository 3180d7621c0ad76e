"""Job output as the agent writes it: `<WHALEFLUX_HOME>/jobs/<job_id>.<attempt>.log`, read from local disk."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from whaleflux.shared.localconfig import home


def log_path(job_id: str, attempt: int, rank: int = 0) -> Path:
    """The agent's log of one attempt; `rank`: which node of a gang spanning nodes (0, the coordinator, by default)."""
    return home() / "jobs" / (f"{job_id}.{attempt}.log" if not rank else f"{job_id}.{attempt}.rank{rank}.log")


def latest_attempt(job_id: str) -> int | None:
    """The highest attempt with a log file here, or None."""
    pattern = re.compile(rf"^{re.escape(job_id)}\.(\d+)\.log$")
    found = [int(m.group(1)) for p in (home() / "jobs").glob(f"{job_id}.*.log") if (m := pattern.match(p.name))]
    return max(found) if found else None


def follow_log(
    job_id: str,
    attempt: int,
    state: Callable[[], tuple[str | None, int | None]],
    *,
    fixed_attempt: bool,
    terminal: set[str],
    poll_s: float = 0.5,
    rank: int = 0,
) -> None:
    """Print the log as it grows; move on to a newer attempt (requeued job); stop once the job has ended."""
    offset, checked = 0, 0.0
    while True:
        path = log_path(job_id, attempt, rank)
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            if chunk:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
                offset += len(chunk)
        if time.monotonic() - checked >= 2 * poll_s:
            checked = time.monotonic()
            current, latest = state()
            if not fixed_attempt and latest and latest > attempt and log_path(job_id, latest, rank).exists():
                sys.stdout.write(f"--- attempt {latest} ---\n")
                attempt, offset = latest, 0
                continue
            if current in terminal and not chunk_pending(path, offset):
                return
        time.sleep(poll_s)


def chunk_pending(path: Path, offset: int) -> bool:
    return path.exists() and path.stat().st_size > offset
