"""Every path a job needs is checked as its user at start (services/agent/preflight.py, issue 37 item 1): a program
or folder the job's user cannot reach fails with the user, the path, the folder in the way and the fix, never a bare
"Permission denied". Real supervisors as the agent starts them; as root the job runs as `nobody`, otherwise as
this user behind a folder it cannot pass through (mode 0600)."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Any

from whaleflux.agent import attempts, jobuser, preflight, supervise

from .rootjobs import reachable_folder

ROOT = os.geteuid() == 0
JOB_USER = "nobody" if ROOT else None  # the user the job runs as
PRIVATE_MODE = 0o700 if ROOT else 0o600  # a folder that user cannot pass through


def _run(tmp_path: Path, argv: list[str], cwd: str, path: str = os.defpath) -> attempts.Exit:
    """Run `argv` in `cwd` through a real supervisor as JOB_USER; how it ended."""
    attempt_dir = tmp_path / "attempts" / "onprem" / "n1" / "job-1.1"
    attempt_dir.mkdir(parents=True)
    spec = attempts.Spec(argv=argv, env={"PATH": path, **jobuser.environment(JOB_USER)}, cwd=cwd,
                         alive=str(attempt_dir.parent / attempts.ALIVE), grace_s=5.0, fence_after_s=300.0,
                         user=JOB_USER)
    attempts.write_spec(attempt_dir, spec)
    with open(tmp_path / "job.log", "ab") as log:
        done = subprocess.run(supervise.command(attempt_dir), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, (tmp_path / "job.log").read_text()
    ended = attempts.read_exit(attempt_dir)
    assert ended is not None
    return ended


def _private_venv(tmp_path: Path) -> tuple[Path, Path]:
    """(a folder the job's user cannot pass through, a `python` inside it), as a venv under /root is to `nobody`."""
    base = reachable_folder(tmp_path, "machine")
    base.mkdir()
    private = base / "root"
    program = private / ".venv" / "bin" / "python"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    private.chmod(PRIVATE_MODE)
    return private, program


def _who() -> str:
    name = JOB_USER or pwd.getpwuid(os.getuid()).pw_name
    return f"job user {name} (uid {pwd.getpwnam(name).pw_uid})"


def test_a_program_the_job_user_cannot_reach_fails_naming_the_user_the_path_the_folder_and_the_fix(tmp_path):
    private, program = _private_venv(tmp_path)
    try:
        ended = _run(tmp_path, [str(program), "-c", "print('hi')"], cwd="/")
    finally:
        private.chmod(0o700)
    assert ended.exit_code is None and ended.error is not None
    fix = preflight.FIX_OTHER_USER if ROOT else preflight.FIX_OWN_USER
    assert ended.error == (f"cannot start command: {_who()} cannot run {program}: {private} is "
                           f"{PRIVATE_MODE:04o}, owner uid {os.getuid()}; {fix}")


def test_a_bare_name_on_no_folder_of_the_path_names_the_path_searched_and_the_folders_it_cannot_enter(tmp_path):
    private, program = _private_venv(tmp_path)
    path = f"{program.parent}{os.pathsep}/usr/bin{os.pathsep}/bin"
    try:
        ended = _run(tmp_path, ["no-such-python-x", "-V"], cwd="/", path=path)
        hidden = _run(tmp_path / "again", ["python"], cwd="/", path=path)
    finally:
        private.chmod(0o700)
    blocked = f"{program.parent}: {private} is {PRIVATE_MODE:04o}, owner uid {os.getuid()}"
    assert ended.error == (f"cannot start command: {_who()} cannot run no-such-python-x: not found on PATH {path}"
                           f" (it cannot look in {blocked}); {preflight.FIX_NOT_FOUND}")
    # `python` is in the venv only (or, where /usr/bin has one, runs from there: the job starts).
    if not any(Path(folder, "python").exists() for folder in ("/usr/bin", "/bin")):
        assert hidden.error is not None and f"cannot run python: not found on PATH {path}" in hidden.error


def test_a_working_folder_the_job_user_cannot_enter_names_the_folder_in_the_way(tmp_path):
    private, _ = _private_venv(tmp_path)
    workdir = private / "work"
    private.chmod(0o700)
    workdir.mkdir()
    private.chmod(PRIVATE_MODE)
    try:
        ended = _run(tmp_path, ["true"], cwd=str(workdir))
    finally:
        private.chmod(0o700)
    fix = preflight.FIX_OTHER_USER if ROOT else preflight.FIX_OWN_USER
    assert ended.error == (f"cannot start command: {_who()} cannot enter the job's folder {workdir}: Permission"
                           f" denied ({private} is {PRIVATE_MODE:04o}, owner uid {os.getuid()}); {fix}")


def test_a_script_whose_interpreter_cannot_be_reached_names_the_interpreter(tmp_path):
    private, program = _private_venv(tmp_path)
    script = private.parent / "tool"
    script.write_text(f"#!{program}\nprint('hi')\n")
    script.chmod(0o755)
    try:
        ended = _run(tmp_path, ["tool"], cwd="/", path=str(private.parent))
    finally:
        private.chmod(0o700)
    assert ended.error is not None and ended.error.startswith(
        f"cannot start command: {_who()} cannot run tool (found at {script}): its interpreter {program}: {private} is")


def test_a_job_whose_paths_are_fine_runs(tmp_path):
    base = reachable_folder(tmp_path, "ok")
    base.mkdir()
    ended = _run(tmp_path, ["sh", "-c", "exit 3"], cwd=str(base))
    assert (ended.exit_code, ended.error) == (3, None)


def test_submit_wait_shows_the_worded_reason_when_the_job_user_cannot_reach_the_program(clean_servers, tmp_path):
    """Through a real agent and the CLI: the README's first job with a `python` in a folder its user cannot pass
    through (as root: a root agent's job user `nobody` and a venv under a 0700 folder, as the issue found it)."""
    from .processes import make_cluster

    private, program = _private_venv(tmp_path)
    cluster = make_cluster(clean_servers, tmp_path)
    settings: dict[str, Any] = {"WHALEFLUX_JOB_USER": "nobody", "WHALEFLUX_ALLOW_ROOT_JOBS": "false",
                "WHALEFLUX_JOB_AREAS": str(reachable_folder(tmp_path, "areas"))} if ROOT else {}
    scheduler = cluster.service("scheduler")
    cluster.agent("r4090-01", PATH=f"{program.parent}{os.pathsep}{os.defpath}", **settings)
    try:
        scheduler.wait_ready()
        done = cluster.cli("submit", "--gpus", "1", "--wait", "--", str(program), "-c", "print('hi')", timeout=120)
    finally:
        cluster.stop()
        private.chmod(0o700)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    fix = preflight.FIX_OTHER_USER if ROOT else preflight.FIX_OWN_USER
    assert f"{_who()} cannot run {program}: {private} is {PRIVATE_MODE:04o}" in said and fix in said, said
