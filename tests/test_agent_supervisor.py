"""The per-attempt supervisor as a real process, no bus: what it records, and when it stops the job itself."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from whaleflux.agent import attempts, preflight, supervise
from whaleflux.agent.supervise import SIGTERM_REASON

from .processes import wait_until

# The job: marks (written atomically) when it starts, on SIGTERM, and when it ends; runs until `release`.
JOB = r"""
import json, os, signal, sys, time
from pathlib import Path

marks = Path(sys.argv[1])

def mark(name, **extra):
    tmp = marks / (name + ".tmp")
    tmp.write_text(json.dumps({"t": time.time(), "pid": os.getpid(), "pgid": os.getpgid(0), **extra}))
    os.replace(tmp, marks / name)

if os.environ.get("ON_SIGTERM") == "mark":
    signal.signal(signal.SIGTERM, lambda *_: mark("sigterm"))
mark("start")
if os.environ.get("RUN_S"):
    time.sleep(float(os.environ["RUN_S"]))
while not (marks / "release").exists():
    time.sleep(0.05)
if os.environ.get("KILL_SELF"):
    os.kill(os.getpid(), signal.SIGKILL)
mark("end")
raise SystemExit(int(os.environ.get("EXIT_CODE", "0")))
"""


def _attempt(tmp_path: Path, *, fence_after_s: float = 300.0, grace_s: float = 5.0, argv: list[str] | None = None,
             cwd: str | None = None, **env: str) -> Path:
    """An attempt folder with its spec, as the agent writes it."""
    attempt_dir = tmp_path / "attempts" / "onprem" / "n1" / "job-1.1"
    attempt_dir.mkdir(parents=True)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    spec = attempts.Spec(
        argv=argv or [sys.executable, str(script), str(tmp_path)],
        env={"PATH": os.environ["PATH"], **env},
        cwd=cwd or str(tmp_path),
        alive=str(attempt_dir.parent / attempts.ALIVE),
        grace_s=grace_s,
        fence_after_s=fence_after_s,
    )
    attempts.write_spec(attempt_dir, spec)
    return attempt_dir


# How a supervisor is started: the agent's command, and `python -m` as agents before `supervise.command` did.
AS_THE_AGENT_DOES = supervise.command
AS_EARLIER_AGENTS_DID = lambda attempt_dir: [sys.executable, "-m", attempts.SUPERVISOR, str(attempt_dir)]  # noqa: E731


def _supervise(attempt_dir: Path, log: Path, command=AS_THE_AGENT_DOES) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(command(attempt_dir), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _mark(tmp_path: Path, name: str) -> dict | None:
    path = tmp_path / name
    return json.loads(path.read_text()) if path.exists() else None


def _must(tmp_path: Path, name: str) -> dict:
    mark = _mark(tmp_path, name)
    assert mark is not None, f"the job left no {name} mark"
    return mark


def _exit(attempt_dir: Path) -> attempts.Exit:
    ended = attempts.read_exit(attempt_dir)
    assert ended is not None, "no exit.json"
    return ended


def _stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t).astimezone()


def test_supervisor_records_the_start_and_the_exit_atomically_with_the_job_in_its_own_process_group(tmp_path):
    attempt_dir = _attempt(tmp_path, EXIT_CODE="7")
    torn: list[Exception] = []
    done = threading.Event()

    def read_while_written():
        # Readers (the agent) may look at any moment: every read is whole or nothing.
        while not done.is_set():
            try:
                attempts.read_running(attempt_dir)
                attempts.read_exit(attempt_dir)
            except ValueError as exc:
                torn.append(exc)

    reader = threading.Thread(target=read_while_written)
    reader.start()
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    try:
        running = wait_until(lambda: attempts.read_running(attempt_dir), what="running.json")
        start = wait_until(lambda: _mark(tmp_path, "start"), what="job started")
        assert running.supervisor_pid == supervisor.pid and running.job_pid == start["pid"] == start["pgid"]
        assert os.getsid(running.job_pid) == running.job_pid != os.getsid(supervisor.pid)
        assert attempts.read_exit(attempt_dir) is None

        (tmp_path / "release").touch()
        assert supervisor.wait(timeout=30) == 0
    finally:
        done.set()
        reader.join()
    ended = _exit(attempt_dir)
    end = _must(tmp_path, "end")
    assert (ended.exit_code, ended.interrupted, ended.error) == (7, None, None)
    assert abs((ended.finished_at - _stamp(end["t"])).total_seconds()) < 1.0
    assert abs((running.started_at - _stamp(start["t"])).total_seconds()) < 1.0
    assert torn == []
    assert sorted(p.name for p in attempt_dir.iterdir()) == ["exit.json", "running.json", "spec.json"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in attempt_dir.iterdir())


def test_a_job_killed_by_a_signal_records_the_negative_signal_number(tmp_path):
    attempt_dir = _attempt(tmp_path, KILL_SELF="1")
    (tmp_path / "release").touch()
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert ended.exit_code == -signal.SIGKILL and ended.interrupted is None
    assert _mark(tmp_path, "end") is None


def test_a_stop_request_before_the_stop_is_recorded_as_interrupted(tmp_path):
    attempt_dir = _attempt(tmp_path)
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    running = wait_until(lambda: attempts.read_running(attempt_dir), what="running.json")
    attempts.request_stop(attempt_dir, "agent stopped: planned shutdown")
    os.killpg(running.job_pid, signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert (ended.exit_code, ended.interrupted) == (-signal.SIGTERM, "agent stopped: planned shutdown")


def test_sigterm_to_the_supervisor_stops_the_job_and_still_records_its_end(tmp_path):
    attempt_dir = _attempt(tmp_path)
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    wait_until(lambda: _mark(tmp_path, "start"), what="job started")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert (ended.exit_code, ended.interrupted) == (-signal.SIGTERM, SIGTERM_REASON)


def test_a_supervisor_whose_agent_went_silent_stops_the_job_itself(tmp_path):
    attempt_dir = _attempt(tmp_path, fence_after_s=1.0, grace_s=1.0, ON_SIGTERM="mark")
    alive = attempt_dir.parent / attempts.ALIVE
    alive.touch()
    log = tmp_path / "job.log"
    supervisor = _supervise(attempt_dir, log)
    # The job ignores SIGTERM (it only marks it), so the grace period ends in SIGKILL.
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert ended.exit_code == -signal.SIGKILL
    assert ended.interrupted is not None and ended.interrupted.startswith("agent silent for ")
    assert ended.interrupted.endswith(": stopped so it cannot run twice")
    sigterm = _mark(tmp_path, "sigterm")
    assert sigterm is not None and _mark(tmp_path, "end") is None
    assert sigterm["t"] - alive.stat().st_mtime >= 1.0
    assert "agent silent for" in log.read_text()


def test_a_supervisor_whose_agent_keeps_touching_its_file_lets_the_job_run_past_fence_after_s(tmp_path):
    attempt_dir = _attempt(tmp_path, fence_after_s=1.0, RUN_S="3")
    alive = attempt_dir.parent / attempts.ALIVE
    (tmp_path / "release").touch()
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    while supervisor.poll() is None:
        alive.touch()
        try:
            supervisor.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    ended = _exit(attempt_dir)
    assert (ended.exit_code, ended.interrupted) == (0, None)
    assert _must(tmp_path, "end")["t"] - _must(tmp_path, "start")["t"] >= 3.0


def test_a_command_that_cannot_start_is_recorded_with_the_reason_and_never_runs(tmp_path):
    attempt_dir = _attempt(tmp_path, argv=[str(tmp_path / "no-such-program")])
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert ended.exit_code is None  # the reason names the command it could not start
    who = preflight.describe(None)
    assert ended.error == (f"cannot start command: {who} cannot run {tmp_path / 'no-such-program'}: no such file;"
                           " check the path in the command")
    assert attempts.read_running(attempt_dir) is None


@pytest.mark.parametrize("command", [AS_THE_AGENT_DOES, AS_EARLIER_AGENTS_DID], ids=["agent's command", "python -m"])
def test_a_running_supervisor_is_told_from_other_processes_by_its_command_line(tmp_path, command):
    # A restarted agent re-adopts the supervisors it finds by this, also those an agent before an upgrade started.
    attempt_dir = _attempt(tmp_path)
    other_dir = attempt_dir.with_name("job-2.1")
    other_dir.mkdir()
    supervisor = _supervise(attempt_dir, tmp_path / "job.log", command)
    try:
        running = wait_until(lambda: attempts.read_running(attempt_dir), what="running.json")
        assert attempts.supervisor_alive(running.supervisor_pid, attempt_dir)
        assert attempts.supervisor_alive(running.supervisor_pid, str(attempt_dir / ".." / attempt_dir.name))
        assert not attempts.supervisor_alive(running.supervisor_pid, other_dir)
        assert not attempts.supervisor_alive(running.job_pid, attempt_dir)  # the job: not its supervisor
    finally:
        (tmp_path / "release").touch()
        assert supervisor.wait(timeout=30) == 0
    assert _exit(attempt_dir).exit_code == 0
    assert not attempts.supervisor_alive(running.supervisor_pid, attempt_dir)


def _ignored_signals() -> int:
    """This process's ignored signals (the SigIgn mask of /proc/self/status)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("SigIgn:"))
    return int(line.split()[1], 16)


# The job (a shell, not Python, which ignores SIGPIPE itself): what it got, one line each: its stdin, the descriptors
# a program it runs has open, the signals that program has ignored (hex mask), its folder, umask, session and pid.
INHERITED = r"""exec > "$1"
readlink /proc/self/fd/0
ls /proc/self/fd | tr '\n' ' '; echo
grep '^SigIgn:' /proc/self/status | cut -f2
pwd
umask
ps -o sid= -p $$ | tr -d ' '
echo $$
"""


def test_the_job_starts_as_popen_would_start_it_stdin_null_no_other_descriptor_no_signal_left_ignored(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    got_file = tmp_path / "got.txt"
    attempt_dir = _attempt(tmp_path, argv=["sh", "-c", INHERITED, "sh", str(got_file)], cwd=str(workdir))
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    assert supervisor.wait(timeout=30) == 0
    assert _exit(attempt_dir).exit_code == 0
    stdin, fds, ignored, cwd, umask, sid, pid = got_file.read_text().splitlines()
    running = attempts.read_running(attempt_dir)
    assert running is not None and int(sid) == int(pid) == running.job_pid
    # 3: the folder `ls` lists, its own; nothing else is open but stdin, stdout, stderr.
    assert stdin == os.devnull and fds.split() == ["0", "1", "2", "3"]
    # Python ignores SIGPIPE and SIGXFSZ; a command must get them back. Whatever the test run itself was started
    # with ignored (SIGHUP under nohup) a job inherits, as from any parent.
    python_own = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert int(ignored, 16) == _ignored_signals() & ~python_own
    assert cwd == str(workdir)
    current = os.umask(0o022)
    os.umask(current)
    assert int(umask, 8) == current  # the supervisor's own, as the agent left it


def test_a_command_whose_folder_is_missing_is_recorded_as_not_started(tmp_path):
    attempt_dir = _attempt(tmp_path, cwd=str(tmp_path / "no-such-folder"))
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    assert supervisor.wait(timeout=30) == 0
    ended = _exit(attempt_dir)
    assert ended.exit_code is None  # the reason names the folder it could not enter
    assert ended.error == (f"cannot start command: {preflight.describe(None)} cannot enter the job's folder"
                           f" {tmp_path / 'no-such-folder'}: No such file or directory")
    assert attempts.read_running(attempt_dir) is None and _mark(tmp_path, "start") is None
