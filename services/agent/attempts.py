"""An attempt's folder on the node: what the agent and the attempt's supervisor leave there.

    <home>/attempts/<cluster>/<node>/agent.alive   touched by the agent after each heartbeat it got out
    <home>/attempts/<cluster>/<node>/<job_id>.<attempt>[.r<rank>]/
        spec.json     the agent, before it starts the supervisor: what to run (0600: it holds the job's env)
        placed.json   the agent: the placement, to re-adopt or report the attempt after an agent restart
        running.json  the supervisor, once the job runs: both pids (the job's is its process group), start time
        exit.json     the supervisor, once the job ended (or could not start): exit code, end time, why stopped
        stop-request  the agent, before it stops the job for a planned stop: the reason
        reported      the agent, once the end is published: when

Every file is written atomically (tmp, fsync, rename), so a reader sees all of it or nothing, also
after a crash or a reboot. Standard library only: the supervisor imports this and must start fast, so no
`pathlib` either (with what it imports, ~4 ms of each start): a folder is any path (`Path` or str), joined by os.path.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

TYPE_CHECKING = False  # not typing's: importing `typing` would cost the supervisor's start more than all the rest
if TYPE_CHECKING:
    from pathlib import Path

SUPERVISOR = "whaleflux.agent.supervise"  # the module each attempt's supervisor runs
ALIVE = "agent.alive"
SPEC, PLACED, RUNNING, EXIT = "spec.json", "placed.json", "running.json", "exit.json"
STOP_REQUEST, REPORTED = "stop-request", "reported"


class _Record:
    """A plain record: its fields are its attributes (`__dict__`, as JSON writes them), equal when those are.

    Not a dataclass: the supervisor imports this module at each job's start, and `dataclasses` (which imports
    `inspect`) would be about a quarter of that start."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Spec(_Record):
    """What the supervisor runs, and when it stops the job on its own."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None, alive: str, grace_s: float,
                 fence_after_s: float, user: str | None = None, area: str | None = None,
                 places: list[str] | None = None, make: list[str] | None = None) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.alive = alive  # the agent's liveness file
        self.grace_s = grace_s  # SIGTERM to SIGKILL when it stops the job itself
        self.fence_after_s = fence_after_s  # agent silence after which it does
        self.user = user  # the user the job runs as (None: the supervisor's own); set only by a root agent
        # The job's area (jobarea.py); `cwd` and `make` (folders to create) are entered and created only in
        # the job's process, as its user, and must really lie inside the area or `places` (its team's roots).
        self.area = area
        self.places = places or []
        self.make = make or []


class Running(_Record):
    def __init__(self, supervisor_pid: int, job_pid: int, started_at: datetime) -> None:
        self.supervisor_pid = supervisor_pid
        self.job_pid = job_pid
        self.started_at = started_at


class Exit(_Record):
    def __init__(self, finished_at: datetime, exit_code: int | None = None, interrupted: str | None = None,
                 error: str | None = None) -> None:
        self.finished_at = finished_at
        self.exit_code = exit_code  # negative: killed by that signal; None: the command never started
        self.interrupted = interrupted  # why the node stopped the job (planned stop, self-fencing)
        self.error = error  # why the command could not start

    @property
    def failed(self) -> bool:
        """A non-zero exit that was no planned stop: the job's own failure."""
        return self.exit_code not in (0, None) and not self.interrupted


def utcnow() -> datetime:
    return datetime.now(UTC)


def dir_name(job_id: str, attempt: int, part: int) -> str:
    """One attempt's folder: `<job>.<attempt>`, a gang's rank r > 0 `<job>.<attempt>.r<r>`."""
    return f"{job_id}.{attempt}" + (f".r{part}" if part else "")


def write_text(path: Path | str, text: str) -> None:
    """Write `path` so that it exists whole or not at all, readable by this user only."""
    write_files(os.path.dirname(path) or ".", {os.path.basename(path): text})


def write_files(folder: Path | str, texts: dict[str, str]) -> None:
    """Write each file of `texts` (name: text) in `folder` as `write_text` does, syncing the folder once for all."""
    for name, text in texts.items():
        path = os.path.join(folder, name)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    # The renames themselves survive a power loss only once the folder is synced.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _read_json(path: str) -> dict | None:
    text = _read(path)
    return None if text is None else json.loads(text)


def spec_text(spec: Spec) -> str:
    return json.dumps(spec.__dict__)


def write_spec(attempt_dir: Path | str, spec: Spec) -> None:
    write_text(os.path.join(attempt_dir, SPEC), spec_text(spec))


def read_spec(attempt_dir: Path | str) -> Spec:
    with open(os.path.join(attempt_dir, SPEC)) as fh:
        return Spec(**json.load(fh))


def _running_fields(running: Running) -> dict:
    return {**running.__dict__, "started_at": running.started_at.isoformat()}


def _running_of(raw: dict) -> Running:
    return Running(raw["supervisor_pid"], raw["job_pid"], datetime.fromisoformat(raw["started_at"]))


def _exit_fields(ended: Exit) -> dict:
    return {**ended.__dict__, "finished_at": ended.finished_at.isoformat()}


def _exit_of(raw: dict) -> Exit:
    return Exit(**{**raw, "finished_at": datetime.fromisoformat(raw["finished_at"])})


def write_running(attempt_dir: Path | str, running: Running) -> None:
    write_text(os.path.join(attempt_dir, RUNNING), json.dumps(_running_fields(running)))


def read_running(attempt_dir: Path | str) -> Running | None:
    raw = _read_json(os.path.join(attempt_dir, RUNNING))
    return None if raw is None else _running_of(raw)


def write_exit(attempt_dir: Path | str, ended: Exit) -> None:
    write_text(os.path.join(attempt_dir, EXIT), json.dumps(_exit_fields(ended)))


def read_exit(attempt_dir: Path | str) -> Exit | None:
    raw = _read_json(os.path.join(attempt_dir, EXIT))
    return None if raw is None else _exit_of(raw)


# The records' second way to the agent that launched the supervisor, when the attempt store cannot take them (a full
# or failing disk): one JSON line each on a pipe whose write end the supervisor inherits, named by this variable.
RECORDS_FD = "WHALEFLUX_RECORDS_FD"


def record_line(record: Running | Exit) -> bytes:
    """One record as a line for the records pipe."""
    if isinstance(record, Running):
        return (json.dumps({RUNNING: _running_fields(record)}) + "\n").encode()
    return (json.dumps({EXIT: _exit_fields(record)}) + "\n").encode()


def records_of(lines: bytes) -> tuple[Running | None, Exit | None]:
    """The start and end records the pipe carried (the last of each; a line cut short is skipped)."""
    running = ended = None
    for line in lines.splitlines():
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if RUNNING in raw:
            running = _running_of(raw[RUNNING])
        elif EXIT in raw:
            ended = _exit_of(raw[EXIT])
    return running, ended


def request_stop(attempt_dir: Path | str, reason: str) -> None:
    write_text(os.path.join(attempt_dir, STOP_REQUEST), reason)


def stop_reason(attempt_dir: Path | str) -> str | None:
    return _read(os.path.join(attempt_dir, STOP_REQUEST))


def mark_reported(attempt_dir: Path | str, at: datetime) -> None:
    write_text(os.path.join(attempt_dir, REPORTED), at.isoformat())


def reported_at(attempt_dir: Path | str) -> datetime | None:
    text = _read(os.path.join(attempt_dir, REPORTED))
    return None if text is None else datetime.fromisoformat(text)


def supervisor_alive(pid: int, attempt_dir: Path | str) -> bool:
    """Whether `pid` is still this attempt's supervisor, not a process that got its pid after a reboot (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # `... SUPERVISOR <attempt-dir>`: `python -m SUPERVISOR <dir>` of earlier agents or `supervise.command`'s form;
    # a zombie's command line is empty: it has exited.
    args = [os.fsdecode(a) for a in cmdline.split(b"\0") if a]
    return len(args) >= 2 and args[-2] == SUPERVISOR and os.path.realpath(args[-1]) == os.path.realpath(attempt_dir)
