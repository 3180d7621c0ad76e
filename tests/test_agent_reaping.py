"""Every process of a job ends with it (issue 36, item 7; services/agent/reaping.py): real supervisors whose jobs
leave a `setsid` child and a double-forked daemon behind, after which nothing of the job may remain by the time
its exit is recorded, whether it exited, was stopped by the agent or stopped by its own supervisor; as root also
with the job run as an unprivileged user, and with the supervisor itself unprivileged (an agent that is not root)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from whaleflux.agent import attempts, jobuser, runner, supervise
from whaleflux.shared.events import JobPlaced

from .processes import until, wait_until
from .rootjobs import reachable_folder

# The job: leaves a `setsid` child and a double-forked daemon that ignores SIGTERM (so the SIGKILL after the grace
# period is what ends it), both sleeping `argv[1]` seconds; waits until both run, then exits 3 or, with `stay`, runs
# on until stopped.
JOB = r"""
import os, subprocess, sys, time
seconds, then = sys.argv[1], sys.argv[2]
subprocess.Popen(["setsid", "sleep", seconds])
subprocess.run(["sh", "-c", f'(setsid sh -c "trap \\"\\" TERM; sleep {seconds}" &) ; exit 0'], check=True)

def sleeping():
    found = 0
    for name in os.listdir("/proc"):
        try:
            found += open(f"/proc/{name}/cmdline", "rb").read() == f"sleep\0{seconds}\0".encode()
        except OSError:
            pass
    return found

while sleeping() < 2:
    time.sleep(0.02)
while then == "stay":
    time.sleep(1)
sys.exit(3)
"""

USERS = [None] + (["nobody"] if os.geteuid() == 0 else [])  # None: the supervisor's own user


def _job_processes(marker: str) -> list[int]:
    """The live processes whose environment holds `marker` (a zombie's is empty)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:  # not a process, or gone meanwhile
            continue
        if marker.encode() in environ.split(b"\0"):
            found.append(int(name))
    return found


def _kill_left(marker: str) -> None:
    for pid in _job_processes(marker):  # a failed test must not leave sleepers on the shared host
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def marker():
    mark = f"WF_REAP_TEST={uuid.uuid4().hex}"
    yield mark
    _kill_left(mark)


def _argv(then: str) -> list[str]:
    return [sys.executable, "-c", JOB, "86400", then]


def _env(marker: str, user: str | None) -> dict[str, str]:
    name, _, value = marker.partition("=")
    return {"PATH": os.environ["PATH"], name: value, **jobuser.environment(user)}


def _attempt(tmp_path: Path, marker: str, user: str | None, then: str, **spec: float) -> Path:
    attempt_dir = tmp_path / "attempts" / "onprem" / "n1" / "job-1.1"
    attempt_dir.mkdir(parents=True)
    attempts.write_spec(attempt_dir, attempts.Spec(
        argv=_argv(then), env=_env(marker, user), cwd="/", alive=str(attempt_dir.parent / attempts.ALIVE),
        grace_s=spec.get("grace_s", 1.0), fence_after_s=spec.get("fence_after_s", 300.0), user=user))
    return attempt_dir


def _supervise(attempt_dir: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(supervise.command(attempt_dir), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


# A subreaper whose child double-forks a sleeper: prints the sleeper's parent, then the pids `descendants` finds.
SUBREAPER = r"""
import os, subprocess, sys, time
from whaleflux.agent import reaping
assert reaping.become_subreaper()
subprocess.run(["sh", "-c", "(sleep 86400 &) ; exit 0"], check=True)
while not (found := reaping.descendants(os.getpid())):
    time.sleep(0.02)
[sleeper] = found
print(open(f"/proc/{sleeper}/stat").read().rpartition(")")[2].split()[1], sleeper)
reaping.end_descendants(grace_s=5.0)
print(reaping.descendants(os.getpid()))
"""


def test_an_orphan_comes_back_to_the_subreaper_which_finds_it_and_ends_it():
    child = subprocess.Popen([sys.executable, "-c", SUBREAPER], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    first, after = out.splitlines()
    parent, _sleeper = map(int, first.split())
    assert parent == child.pid  # not init: the sh that forked it exited at once
    assert after == "[]"


@pytest.mark.parametrize("user", USERS, ids=lambda u: u or "own user")
def test_a_job_that_exits_leaves_nothing_running_once_its_exit_is_recorded(tmp_path, marker, user):
    attempt_dir = _attempt(tmp_path, marker, user, then="exit")
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    # The job's `setsid` child and its daemon are in sessions of their own: the job's process group is not theirs.
    running = wait_until(lambda: attempts.read_running(attempt_dir), what="running.json")
    ended = wait_until(lambda: attempts.read_exit(attempt_dir), what="exit.json")
    assert _job_processes(marker) == []
    assert (ended.exit_code, ended.interrupted, ended.error) == (3, None, None)  # the main process's
    assert supervisor.wait(timeout=30) == 0
    assert running.job_pid != supervisor.pid


@pytest.mark.parametrize("user", USERS, ids=lambda u: u or "own user")
def test_a_supervisor_that_fences_its_job_ends_the_escaped_processes_too(tmp_path, marker, user):
    attempt_dir = _attempt(tmp_path, marker, user, then="stay", fence_after_s=1.0, grace_s=0.5)
    supervisor = _supervise(attempt_dir, tmp_path / "job.log")
    ended = wait_until(lambda: attempts.read_exit(attempt_dir), what="exit.json")
    assert _job_processes(marker) == []
    assert ended.exit_code == -signal.SIGTERM and ended.interrupted is not None
    assert ended.interrupted.startswith("agent silent for ")
    assert supervisor.wait(timeout=30) == 0


def _placed(marker: str, job_id: str) -> JobPlaced:
    name, _, value = marker.partition("=")
    return JobPlaced(job_id=job_id, attempt=1, cluster="onprem", node="n1", gpu_model="H100", gpu_uuids=["GPU-0"],
                     gpu_indices=[0], command=_argv("stay"), env={name: value}, team="t", project="p")


@pytest.mark.parametrize("user", USERS, ids=lambda u: u or "own user")
async def test_a_job_stopped_by_the_agent_leaves_nothing_running_once_its_end_is_recorded(tmp_path, marker, user):
    home = tmp_path / "home"
    places = runner.JobPlaces(reachable_folder(tmp_path, "areas"))  # its user must reach its area
    job = await runner.launch(_placed(marker, "reap-1"), home / "jobs", home / "attempts" / "onprem" / "n1", places,
                              grace_s=1.0, fence_after_s=300.0, run_as=user)
    # Both escaped sleepers run (the job waits for them): then the stop, as a cancel does it.
    await until(lambda: len(_job_processes(marker)) >= 4, timeout=30, what="the job and its escaped processes")
    await runner.stop(job, grace_s=1.0, reason="cancelled")
    ended = job.ended.result()
    assert ended is not None and attempts.read_exit(job.dir) == ended
    assert _job_processes(marker) == []
    assert (ended.exit_code, ended.interrupted) == (-signal.SIGTERM, "cancelled")


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a supervisor as another user needs root")
def test_an_unprivileged_supervisor_ends_the_escaped_processes_too(tmp_path, marker):
    # As under an agent that is not root: the subreaper needs no privilege, and its job runs as its own user.
    nobody = pwd.getpwnam("nobody")
    home = Path(tempfile.mkdtemp(prefix="whaleflux-reap-"))  # tmp_path's parents are root's only
    try:
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        attempt_dir = home / "job-1.1"
        attempt_dir.mkdir()
        attempts.write_spec(attempt_dir, attempts.Spec(
            argv=_argv("exit"), env=_env(marker, None), cwd="/", alive=str(home / attempts.ALIVE), grace_s=1.0,
            fence_after_s=300.0))
        for path in (attempt_dir, attempt_dir / attempts.SPEC):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        with open(tmp_path / "job.log", "ab") as out:
            supervisor = subprocess.Popen(supervise.command(attempt_dir), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True, user=nobody.pw_uid,
                                          group=nobody.pw_gid, extra_groups=[], cwd="/")
        ended = wait_until(lambda: attempts.read_exit(attempt_dir), what="exit.json")
        assert _job_processes(marker) == []
        assert ended.exit_code == 3
        assert supervisor.wait(timeout=30) == 0
    finally:
        shutil.rmtree(home)
