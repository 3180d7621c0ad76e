"""Run a job's command on the node, each attempt under its own supervisor (supervise.py), and stop it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from whaleflux.shared import job_paths
from whaleflux.shared.events import JobPlaced

from . import attempts, disk, jobarea, jobuser, logtail, supervise

# The agent's own connection secrets must never leak into a job's environment.
_PRIVATE_ENV = ("WHALEFLUX_", "NATS_", "REDIS_")


def job_environment(placed: JobPlaced, base: Mapping[str, str] | None = None,
                    checkpoint: str | None = None) -> dict[str, str]:
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith(_PRIVATE_ENV)}
    env.update(placed.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(placed.gpu_uuids),
            "WHALEFLUX_JOB_ID": placed.job_id,
            "WHALEFLUX_ATTEMPT": str(placed.attempt),
            # A requeued attempt (preemption, failover) continues from here when WHALEFLUX_RESUME=1.
            "WHALEFLUX_RESUME": "1" if placed.resume else "0",
        }
    )
    if checkpoint is not None:
        env["WHALEFLUX_CHECKPOINT_DIR"] = checkpoint
    env.update(gang_environment(placed, env))
    return env


def gang_environment(placed: JobPlaced, job_env: dict[str, str]) -> dict[str, str]:
    """Where this process sits in its job: node rank, node count, the coordinator (rank 0) node.

    Set for every job (a one-node job is rank 0 of 1 on its own node). The
    torchrun names NODE_RANK, NNODES and MASTER_ADDR are set too for a gang
    spanning nodes, unless the job's own environment sets them: MASTER_ADDR is
    the rank-0 node's name, which is its host name for an `--nvml` agent (set
    WHALEFLUX_NODE_NAME or the job's MASTER_ADDR where that does not resolve).
    """
    nodes = placed.gang_nodes or [placed.node]
    out = {
        "WHALEFLUX_NODE_RANK": str(placed.part),
        "WHALEFLUX_NUM_NODES": str(len(nodes)),
        "WHALEFLUX_COORDINATOR": nodes[0],
        "WHALEFLUX_GANG_NODES": ",".join(nodes),
        "WHALEFLUX_GANG_GPUS": str(placed.gang_gpus or len(placed.gpu_uuids)),
    }
    if placed.gang_nodes:
        for name, value in (("NODE_RANK", str(placed.part)), ("NNODES", str(len(nodes))), ("MASTER_ADDR", nodes[0])):
            if name not in placed.env:
                out[name] = value
    return out


def log_name(job_id: str, attempt: int, rank: int = 0) -> str:
    """The log file of one attempt on this node: rank 0 (and a one-node job) `<job>.<attempt>.log`,
    another rank of a gang `<job>.<attempt>.rank<r>.log`."""
    return f"{job_id}.{attempt}.log" if not rank else f"{job_id}.{attempt}.rank{rank}.log"


def _read_log_end(path: Path, limit: int) -> tuple[bytes, bool] | None:
    """The last `limit` bytes of a log and whether the file holds more before them; None when there is none."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            return fh.read(), size > limit
    except FileNotFoundError:
        return None


async def log_tail(placed: JobPlaced, log_dir: Path) -> list[str] | None:
    """The last lines of the attempt's log, secrets masked (logtail.py); None when it left no log or no line."""
    path = log_dir / log_name(placed.job_id, placed.attempt, placed.part)
    end = await asyncio.to_thread(_read_log_end, path, logtail.TAIL_BYTES)  # off the loop: a file read
    if end is None:
        return None
    return logtail.tail_lines(end[0], placed.env, truncated=end[1]) or None


# The node's stores, as its reasons name them.
ATTEMPT_STORE, LOG_STORE, AREA_STORE = "attempt store", "log directory", "job areas"


class CannotStart(Exception):
    """The attempt's command did not start; the message says why."""


@dataclass
class RecordsPipe:
    """The read end of the pipe on which a supervisor sends the records its attempt store could not take."""

    fd: int
    got: bytes = field(default=b"")

    def records(self) -> tuple[attempts.Running | None, attempts.Exit | None]:
        """What the supervisor sent so far (never blocks)."""
        while self.fd >= 0:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:  # the supervisor (and any copy of the write end) is gone
                self.close()
                break
            self.got += chunk
        return attempts.records_of(self.got)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class RunningJob:
    """An attempt running here under its supervisor, launched by this agent or adopted from an earlier one."""

    placed: JobPlaced
    dir: Path  # its attempt folder (attempts.py)
    running: attempts.Running  # the job's pid is also its process group, which stops signal
    # Done once the job ended: the recorded exit, or None if the supervisor died without recording one.
    ended: asyncio.Task[attempts.Exit | None]


@contextmanager
def _writing(store: disk.Store) -> Iterator[None]:
    """A write to `store`: a disk fault (full, read-only, failing) raises DiskFault with the node's reason."""
    try:
        yield
    except OSError as exc:
        why = disk.fault_of_write(store, exc)
        if why is None:
            raise
        raise disk.DiskFault(why) from exc


def _supervisor_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV)}


@dataclass(frozen=True)
class JobPlaces:
    """Where a node's jobs keep their folders: the folder of their areas (jobarea.py) and, per team, the absolute
    roots they may also name (shared/job_paths.py)."""

    areas: Path
    team_roots: Mapping[str, list[str]] = field(default_factory=dict)

    def refused(self, placed: JobPlaced) -> str | None:
        """Why a placement's folders are not the job's own (the scheduler refuses them too); None if they are."""
        refused = job_paths.refusals({"workdir": placed.workdir, "checkpoint_dir": placed.checkpoint_dir},
                                     placed.team, self.team_roots)
        return "; ".join(f"{name}: {why}" for name, why in refused.items()) or None


def _prepare(placed: JobPlaced, log_dir: Path, node_dir: Path, places: JobPlaces, grace_s: float,
             fence_after_s: float, run_as: str | None = None) -> tuple[Path, int]:
    """The job's area, the attempt's folder with its placement and spec (local files, fsynced), and the job's log,
    open. The agent creates only what it names itself (the area, the log); the job's own folders are created and
    entered by the job's process as its user (jobarea.enter). A disk fault on the way raises DiskFault naming the
    store (`attempt store`, `log directory`, `job areas`)."""
    if (refused := places.refused(placed)) is not None:
        raise CannotStart(refused)
    logs = disk.Store(LOG_STORE, log_dir)
    with _writing(logs):
        log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        with _writing(disk.Store(AREA_STORE, places.areas)):
            area = jobarea.make(str(places.areas), placed.job_id, *jobuser.owner(run_as))
    except disk.DiskFault:
        raise
    except OSError as exc:
        raise CannotStart(f"cannot prepare the job's area in {places.areas}: {exc.strerror or exc}") from exc
    checkpoint = job_paths.resolve(placed.checkpoint_dir or "checkpoints", area)
    workdir = job_paths.resolve(placed.workdir, area)
    # A job switched to another user keeps only an allow-list of the agent's environment (jobuser.scrubbed).
    base = jobuser.scrubbed(os.environ) if run_as is not None else None
    env = {**job_environment(placed, base, checkpoint), **jobuser.environment(run_as, area)}
    attempt_dir = node_dir / attempts.dir_name(placed.job_id, placed.attempt, placed.part)
    # Folders inside the area are the job's to create; one in a team root must exist already.
    make = [checkpoint, *([workdir] if job_paths.within(workdir, area) else [])]
    # The job's environment may hold its secrets: they go in a 0600 file, never on a command line.
    spec = attempts.Spec(argv=placed.command, env=env, cwd=workdir, alive=str(node_dir / attempts.ALIVE),
                         grace_s=grace_s, fence_after_s=fence_after_s, user=run_as, area=area,
                         places=job_paths.team_roots(placed.team, places.team_roots), make=make)
    with _writing(disk.Store(ATTEMPT_STORE, node_dir)):
        attempt_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Both before the supervisor starts, one folder sync for the two (neither counts without its running.json).
        attempts.write_files(attempt_dir, {attempts.PLACED: placed.model_dump_json(),
                                           attempts.SPEC: attempts.spec_text(spec)})
    # Logs are the agent's (0600 in a 0700 folder): no job reads another's, through its working folder or else.
    with _writing(logs):
        log = os.open(log_dir / log_name(placed.job_id, placed.attempt, placed.part),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return attempt_dir, log


async def launch(placed: JobPlaced, log_dir: Path, node_dir: Path, places: JobPlaces, *, grace_s: float,
                 fence_after_s: float, run_as: str | None = None) -> RunningJob:
    """Start the command under a supervisor (supervise.py) and wait until it runs; raise CannotStart if it cannot."""
    # The files are fsynced: off the event loop, which carries every other job's events meanwhile.
    attempt_dir, log_fd = await asyncio.to_thread(_prepare, placed, log_dir, node_dir, places, grace_s,
                                                  fence_after_s, run_as)
    # The records' second way here, should the attempt store fail while the job runs (attempts.RECORDS_FD).
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    pipe = RecordsPipe(read_end)
    with os.fdopen(log_fd, "ab") as log:
        try:
            supervisor = await asyncio.create_subprocess_exec(
                *supervise.command(attempt_dir),
                env={**_supervisor_env(), attempts.RECORDS_FD: str(write_end)},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(write_end,),
                # Its own session: the terminal's Ctrl-C never reaches it, and it outlives the agent.
                start_new_session=True,
            )
        except OSError as exc:
            pipe.close()
            raise CannotStart(f"cannot start the supervisor: {exc.strerror or exc}") from exc
        finally:
            os.close(write_end)  # the supervisor holds its own copy: end of file once it is gone
    try:
        running = await _started(attempt_dir, supervisor, pipe)
    except CannotStart:
        pipe.close()
        raise
    ended = asyncio.create_task(_exit_of_child(attempt_dir, supervisor, running.job_pid, pipe))
    return RunningJob(placed, attempt_dir, running, ended)


async def _started(attempt_dir: Path, supervisor: asyncio.subprocess.Process, pipe: RecordsPipe) -> attempts.Running:
    while True:
        gone = supervisor.returncode is not None  # before reading, so that what it wrote before exiting is seen
        sent_running, sent_exit = pipe.records()
        ended = attempts.read_exit(attempt_dir) or sent_exit
        if ended is not None and ended.error:
            raise CannotStart(ended.error)
        running = attempts.read_running(attempt_dir) or sent_running
        if running is not None:
            return running
        if gone:
            raise CannotStart(f"the supervisor exited with {supervisor.returncode} before starting the command")
        await asyncio.sleep(0.02)


def adopt(placed: JobPlaced, attempt_dir: Path, running: attempts.Running) -> RunningJob:
    """Watch an attempt an earlier agent launched, whose supervisor still runs."""
    ended = asyncio.create_task(_exit_of_adopted(attempt_dir, running))
    return RunningJob(placed, attempt_dir, running, ended)


async def _exit_of_child(attempt_dir: Path, supervisor: asyncio.subprocess.Process,
                         job_pid: int, pipe: RecordsPipe) -> attempts.Exit | None:
    await supervisor.wait()
    try:
        sent = pipe.records()[1]  # what it could not write to the attempt store, it sent here
    finally:
        pipe.close()
    return attempts.read_exit(attempt_dir) or sent or _recorded_exit(attempt_dir, job_pid)


async def _exit_of_adopted(attempt_dir: Path, running: attempts.Running) -> attempts.Exit | None:
    # Not this agent's child: nothing to wait on but the files.
    while (ended := attempts.read_exit(attempt_dir)) is None:
        if not attempts.supervisor_alive(running.supervisor_pid, attempt_dir):
            break
        await asyncio.sleep(0.2)  # noqa: ASYNC110  (another process's files: nothing to await but a poll)
    return ended or _recorded_exit(attempt_dir, running.job_pid)


def _recorded_exit(attempt_dir: Path, job_pid: int) -> attempts.Exit | None:
    """The exit the supervisor recorded; if it died without one, its job must not run on unwatched."""
    ended = attempts.read_exit(attempt_dir)
    if ended is None:
        _signal_group(job_pid, signal.SIGKILL)
    return ended


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


async def stop(job: RunningJob, grace_s: float = 10.0, reason: str | None = None) -> None:
    """SIGTERM the job's process group, SIGKILL after the grace period; return once its end is recorded.

    `reason`: a planned stop, recorded as the attempt's `interrupted`.
    """
    if job.ended.done():
        return
    if reason is not None:  # written (fsynced, off the loop) before the SIGTERM, so the supervisor records it
        await asyncio.to_thread(attempts.request_stop, job.dir, reason)
    _signal_group(job.running.job_pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(job.ended), grace_s)
    except TimeoutError:
        _signal_group(job.running.job_pid, signal.SIGKILL)
        await job.ended
