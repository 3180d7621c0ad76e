"""What an earlier agent left on this node: the attempt folders that still matter after a restart."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import structlog

from whaleflux.shared.events import JobPlaced

from . import attempts

log = structlog.get_logger("whaleflux.agent")


@dataclass(frozen=True)
class LeftAttempt:
    dir: Path
    placed: JobPlaced
    running: attempts.Running | None
    ended: attempts.Exit | None  # None: still running under its supervisor
    reported_at: datetime | None  # when its end was published, if it was


def _read(attempt_dir: Path) -> LeftAttempt | None:
    """The attempt as its files tell it, or None where there is nothing to take up."""
    placed_file = attempt_dir / attempts.PLACED
    if not placed_file.exists():
        return None
    placed = JobPlaced.model_validate_json(placed_file.read_text())
    running, ended = attempts.read_running(attempt_dir), attempts.read_exit(attempt_dir)
    if ended is None and (running is None or not attempts.supervisor_alive(running.supervisor_pid, attempt_dir)):
        # Never started, or its supervisor died without recording the end (a reboot, a kill -9):
        # nothing to report, and unlisted in heartbeats the scheduler ends it as lost.
        return None
    return LeftAttempt(attempt_dir, placed, running, ended, attempts.reported_at(attempt_dir))


def scan(node_dir: Path) -> list[LeftAttempt]:
    """The attempts left in `node_dir` that run or ended; removes the folders of the others."""
    found = []
    for attempt_dir in sorted(p for p in node_dir.iterdir() if p.is_dir()):
        try:
            left = _read(attempt_dir)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a bad folder must not stop the agent
            log.warning("agent.attempt_unreadable", dir=str(attempt_dir), error=repr(exc))
            left = None
        if left is None:
            shutil.rmtree(attempt_dir, ignore_errors=True)
        else:
            found.append(left)
    return found
