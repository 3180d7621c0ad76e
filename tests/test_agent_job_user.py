"""Jobs run as an unprivileged user (issue 18, item 3; services/agent/jobuser.py): the rule, and a real supervisor
that switches to the user before it starts the command."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from whaleflux.agent import attempts, jobuser
from whaleflux.agent.app import AgentSettings

NOBODY = pwd.getpwnam("nobody")


def test_root_runs_jobs_as_the_named_user_and_as_root_only_when_allowed():
    assert jobuser.resolve(None, allow_root=False, euid=0) is None
    assert jobuser.resolve("nobody", allow_root=False, euid=0) == "nobody"
    assert jobuser.resolve(str(NOBODY.pw_uid), allow_root=False, euid=0) == "nobody"
    with pytest.raises(ValueError, match="WHALEFLUX_ALLOW_ROOT_JOBS"):
        jobuser.resolve("root", allow_root=False, euid=0)
    assert jobuser.resolve("root", allow_root=True, euid=0) is None  # root already: nothing to switch
    with pytest.raises(ValueError, match="no user 'no-such-user-x'"):
        jobuser.resolve("no-such-user-x", allow_root=False, euid=0)


def test_an_agent_that_is_not_root_runs_jobs_as_itself_and_cannot_name_another():
    assert jobuser.resolve(None, allow_root=False, euid=NOBODY.pw_uid) is None
    assert jobuser.resolve("nobody", allow_root=False, euid=NOBODY.pw_uid) is None  # itself
    with pytest.raises(ValueError, match="only an agent running as root"):
        jobuser.resolve("root", allow_root=True, euid=NOBODY.pw_uid)


def test_the_agent_refuses_to_start_with_a_root_job_user(monkeypatch):
    monkeypatch.setenv("WHALEFLUX_JOB_USER", "root")
    with pytest.raises(ValueError, match="WHALEFLUX_ALLOW_ROOT_JOBS"):
        AgentSettings()


def test_the_job_environment_is_the_job_users():
    assert jobuser.environment(None) == {} and jobuser.popen_args(None) == (None, None, None, -1)
    assert jobuser.environment("nobody") == {"HOME": NOBODY.pw_dir, "USER": "nobody", "LOGNAME": "nobody"}
    assert jobuser.popen_args("nobody")[2:] == ([], 0o077)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root supervisor")
def test_a_root_supervisor_starts_the_command_as_the_job_user_without_roots_groups(tmp_path):
    attempt_dir = tmp_path / "attempts" / "onprem" / "n1" / "job-1.1"
    attempt_dir.mkdir(parents=True)
    spec = attempts.Spec(argv=["sh", "-c", "id -u; id -G; echo $HOME"],
                         env={"PATH": os.environ["PATH"], **jobuser.environment("nobody")}, cwd="/",
                         alive=str(attempt_dir.parent / attempts.ALIVE), grace_s=5.0, fence_after_s=300.0,
                         user="nobody")
    attempts.write_spec(attempt_dir, spec)
    log = tmp_path / "job.log"
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "whaleflux.agent.supervise", str(attempt_dir)], stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0
    ended = attempts.read_exit(attempt_dir)
    assert ended is not None and ended.exit_code == 0, log.read_text()
    uid, groups, home = log.read_text().split("\n")[:3]
    assert uid == str(NOBODY.pw_uid) and groups.split() == [str(NOBODY.pw_gid)] and home == NOBODY.pw_dir


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_checkpoint_folder_is_given_to_the_job_user(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    jobuser.give(folder, None)
    assert folder.stat().st_uid == os.geteuid()
    jobuser.give(folder, "nobody")
    assert folder.stat().st_uid == NOBODY.pw_uid
