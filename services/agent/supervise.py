"""One attempt's supervisor: `python -m whaleflux.agent.supervise <attempt-dir>`, started by the agent as `command`.

The agent starts it in a session of its own, so it neither gets the terminal's
SIGINT nor dies with the agent. It runs the job's command (`spec.json`) in a
process group of its own (the job's pid is the group id, which stop orders
signal), records when the job started and how it ended (attempts.py), and
stops the job itself once the agent has been silent for `fence_after_s`: by
then the scheduler may run the attempt elsewhere, and it must never run twice.
It is the child subreaper of the job's processes (reaping.py): once the job's
main process has ended, however, it ends every process the job left behind,
and records the exit only then, so the GPU is shown free only then.

Its output and the job's go to the job's log, which the agent opened for it.
Standard library only, and little of it (no pathlib or typing), so that it starts fast: it is paid once per job
(bench/supervisor_start.py). The job itself is started by `subprocess.Popen`, not by a fork and exec of our own:
what it gets (user and groups, session, signals, descriptors) is the kind of thing not to write by hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from . import attempts, jobarea, jobuser, preflight, reaping

TYPE_CHECKING = False  # not typing's, which would cost each start ~25 ms
if TYPE_CHECKING:
    from pathlib import Path

CHECK_S = 0.5  # how often it looks at the agent's liveness file
SIGTERM_REASON = "supervisor got SIGTERM: the node is stopping"

# How the agent starts it: isolated and without `site` (-I -S), which with an editable install's import finder was
# ~20 of the ~40 ms of CPU a start took (now ~25 in all, bench/supervisor_start.py), once per job. Without `site` the
# package is not on the path, so the command names this folder and maps the package to it before importing this
# module by its name. Its command line still ends `whaleflux.agent.supervise <attempt-dir>`, which is how
# `attempts.supervisor_alive` tells a supervisor (of this form or the `-m` one of earlier agents) from another process.
_BOOT = ("import sys; _, where, name, attempt_dir = sys.argv\n"
         "for package, path in (('whaleflux', []), ('whaleflux.agent', [where])):\n"
         "    sys.modules[package] = module = type(sys)(package); module.__path__ = path\n"
         "__import__(name); sys.modules[name].supervise(attempt_dir)\n")


def command(attempt_dir: Path) -> list[str]:
    """The supervisor's command line for `attempt_dir` (absolute, as `supervisor_alive` compares it)."""
    return [sys.executable, "-I", "-S", "-c", _BOOT, os.path.dirname(os.path.abspath(__file__)), attempts.SUPERVISOR,
            str(attempt_dir)]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait(job: subprocess.Popen, timeout: float) -> int | None:
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _stop(job: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM to the job's process group, SIGKILL after the grace period; its exit code."""
    _signal_group(job.pid, signal.SIGTERM)
    code = _wait(job, grace_s)
    if code is None:
        _signal_group(job.pid, signal.SIGKILL)
        code = job.wait()
    return code


def _start(spec: attempts.Spec) -> subprocess.Popen:
    """Start the job's command as its user. Its own folders (the spec's area) are created and entered in the job's
    process after the switch to that user, never as root (not Popen's `cwd`, entered before the switch). There too,
    as that user, the command's program is looked up and checked (preflight.py). OSError with the reason, naming
    the job's user, the path and the fix, if it cannot start."""
    uid, gid, groups, umask = jobuser.popen_args(spec.user)
    who = preflight.describe(spec.user)
    switched = uid is not None
    search = os.get_exec_path(spec.env)
    refused_r, refused_w = os.pipe()

    def refuse(text: str) -> None:
        os.write(refused_w, text.encode(errors="replace"))
        os._exit(127)

    def enter() -> None:  # in the job's process, once it is the job's user
        try:
            try:
                if spec.area is not None:
                    jobarea.enter(spec.cwd or spec.area, spec.make, [spec.area, *spec.places])
                elif spec.cwd is not None:  # an attempt of an agent from before job areas
                    os.chdir(spec.cwd)
            except OSError as exc:
                refuse(preflight.folder(exc, who, switched))
            why = preflight.program(spec.argv[0], search, who, switched) if spec.argv else None
        except Exception as exc:  # noqa: BLE001 - said through the pipe: Popen would only say "preexec_fn failed"
            why = f"{who} cannot start the command: {exc!r}"
        if why is not None:
            refuse(why)

    try:
        job = subprocess.Popen(spec.argv, env=spec.env, stdin=subprocess.DEVNULL, start_new_session=True,
                               user=uid, group=gid, extra_groups=groups, umask=umask, preexec_fn=enter)
    except OSError as exc:  # what the check could not see (a format the kernel cannot run)
        os.close(refused_r)
        raise OSError(f"{who} cannot run {spec.argv[0]}: {exc.strerror or exc}") from exc
    finally:
        os.close(refused_w)
    with os.fdopen(refused_r, "rb") as pipe:
        refused = pipe.read()  # nothing once the command runs (the pipe closes on exec)
    if refused:
        job.wait()
        raise OSError(refused.decode(errors="replace"))
    return job


def _last_sign_of_life(alive: str, since: float) -> float:
    try:
        return max(since, os.stat(alive).st_mtime)
    except FileNotFoundError:
        return since


def _record(attempt_dir: Path | str, record: attempts.Running | attempts.Exit) -> None:
    """Write the record to the attempt's folder, or, where its disk fails (full, read-only), send it to the agent on
    the records pipe: an attempt that ran is reported (and billed) whatever the node's disk did."""
    try:
        if isinstance(record, attempts.Running):
            attempts.write_running(attempt_dir, record)
        else:
            attempts.write_exit(attempt_dir, record)
        return
    except OSError as exc:
        failed = exc
    fd = os.environ.get(attempts.RECORDS_FD)
    if fd is None:
        raise failed
    try:
        os.write(int(fd), attempts.record_line(record))  # a line of < 1 KiB to a pipe: whole or not at all
    except OSError:  # the agent is gone (EPIPE): nobody to tell; the record is lost with the disk
        raise failed from None


def supervise(attempt_dir: Path | str) -> None:
    """Run the attempt's command to its end and record how it started and ended."""
    spec = attempts.read_spec(attempt_dir)
    begun = time.time()
    # Before the job starts: its orphans (`setsid cmd &`, daemons) come back here, not to init.
    reaping.become_subreaper()
    try:
        job = _start(spec)
    except OSError as exc:
        reason = f"cannot start command: {exc}"
        _record(attempt_dir, attempts.Exit(finished_at=attempts.utcnow(), error=reason))
        return
    _record(attempt_dir, attempts.Running(os.getpid(), job.pid, attempts.utcnow()))
    got_sigterm = False

    def on_sigterm(signum, frame):  # noqa: ARG001
        # A service manager stopping the whole node signals this process too: pass it on
        # to the job and stay to record its end, rather than leave the attempt unaccounted for.
        nonlocal got_sigterm
        got_sigterm = True
        if job.returncode is None:  # once collected, its pid may be another process's
            _signal_group(job.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    fenced = code = None
    while code is None:
        code = _wait(job, CHECK_S)
        reaping.reap_children(keep=job.pid)  # orphans that ended while the job runs
        silent_s = time.time() - _last_sign_of_life(spec.alive, begun)
        if code is None and silent_s > spec.fence_after_s:
            fenced = f"agent silent for {silent_s:.0f} s: stopped so it cannot run twice"
            try:
                print(f"whaleflux supervisor: {fenced}", file=sys.stderr, flush=True)
            except OSError:  # a full log disk must not stop the stop
                pass
            code = _stop(job, spec.grace_s)
    # Whatever the job left running (its other process groups, its daemons) ends before its exit is recorded.
    reaping.end_descendants(spec.grace_s)
    # A stop the agent asked for names its reason; else this supervisor's own reason, if it stopped the job.
    interrupted = attempts.stop_reason(attempt_dir) or fenced or (SIGTERM_REASON if got_sigterm else None)
    ended = attempts.Exit(finished_at=attempts.utcnow(), exit_code=code, interrupted=interrupted)
    _record(attempt_dir, ended)


if __name__ == "__main__":
    supervise(sys.argv[1])
