"""Jobs run as an unprivileged user (issue 18, item 3; issue 36, item 2; services/agent/jobuser.py): the rule (a
root agent's default is a uid of the team's own from a pool, a team's or project's user from the mapping, root
only when allowed), the scrubbed environment, a real supervisor that switches to the user before it starts the
command, and a root agent process that runs each team's jobs as the team's own uid by default."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from whaleflux.agent import attempts, jobuser
from whaleflux.agent.app import AgentSettings

NOBODY = pwd.getpwnam("nobody")


def test_root_runs_jobs_as_the_named_user_and_as_root_only_when_allowed():
    assert jobuser.resolve(None, allow_root=False, euid=0) is None  # no one user for all: a uid per team
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
    monkeypatch.delenv("WHALEFLUX_ALLOW_ROOT_JOBS", raising=False)  # the suite's own allowance (rootjobs.py)
    monkeypatch.setenv("WHALEFLUX_JOB_USER", "root")
    with pytest.raises(ValueError, match="WHALEFLUX_ALLOW_ROOT_JOBS"):
        AgentSettings()


def test_a_team_or_project_maps_to_its_own_user_and_root_needs_the_allowance_there_too(tmp_path):
    users = jobuser.JobUsers.resolve(None, {"vision": "nobody", "vision/serving": "daemon"}, allow_root=False,
                                     euid=0, pool_file=str(tmp_path / "uids.json"))
    assert users.for_job("vision", "serving") == "daemon"  # the more specific key wins
    assert users.for_job("vision", "research") == "nobody"
    nlp, ops = users.for_job("nlp", "default"), users.for_job("ops", "x")  # a root agent's default: the pool
    assert nlp != ops and all(61184 <= int(str(uid)) <= 65519 for uid in (nlp, ops))
    allowed = jobuser.JobUsers.resolve("root", {"vision": "nobody"}, allow_root=True, euid=0)
    assert allowed.for_job("nlp", "x") is None and allowed.for_job("vision", "x") == "nobody"
    with pytest.raises(ValueError, match=r"WHALEFLUX_JOB_USERS\['ops'\].*WHALEFLUX_ALLOW_ROOT_JOBS"):
        jobuser.JobUsers.resolve(None, {"ops": "root"}, allow_root=False, euid=0)
    with pytest.raises(ValueError, match=r"WHALEFLUX_JOB_USERS\['vision'\]: only an agent running as root"):
        jobuser.JobUsers.resolve(None, {"vision": "daemon"}, allow_root=False, euid=NOBODY.pw_uid)
    with pytest.raises(ValueError, match="no user 'no-such-user-x'"):
        AgentSettings(job_users={"vision": "no-such-user-x"})


def test_a_job_switched_to_another_user_keeps_only_the_allow_listed_environment():
    agent_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "NVIDIA_VISIBLE_DEVICES": "all",
                 "AWS_SECRET_ACCESS_KEY": "k", "SSH_AUTH_SOCK": "/tmp/agent", "HOME": "/root",
                 "WHALEFLUX_NATS_PASSWORD": "p", "http_proxy": "http://u:p@proxy"}
    assert jobuser.scrubbed(agent_env) == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C",
                                           "NVIDIA_VISIBLE_DEVICES": "all"}


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


def test_each_team_keeps_its_own_pool_uid_across_agents_and_none_the_machine_gave_anyone(tmp_path):
    pool_file = str(tmp_path / "uids.json")
    taken = NOBODY.pw_uid  # a uid /etc/passwd names, inside the range asked for
    first = jobuser.UidPool(pool_file, taken, taken + 3)
    vision, nlp = first.uid_for("vision"), first.uid_for("nlp")
    assert len({vision, nlp, str(taken)}) == 3
    again = jobuser.UidPool(pool_file, taken, taken + 3)  # another agent, or this one restarted
    assert again.uid_for("nlp") == nlp and again.uid_for("vision") == vision
    assert again.uid_for("ops") not in (vision, nlp, str(taken))
    with pytest.raises(RuntimeError, match="all 4 uids are taken"):
        again.uid_for("one-too-many")
    with pytest.raises(ValueError, match="WHALEFLUX_JOB_UIDS"):
        jobuser.parse_range("10-5")


def test_a_pool_uid_runs_with_its_own_group_and_the_area_as_home():
    assert jobuser.popen_args("61190") == (61190, 61190, [], 0o077)
    assert jobuser.environment("61190", "/areas/j1") == {"HOME": "/areas/j1", "USER": "whaleflux-61190",
                                                         "LOGNAME": "whaleflux-61190"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the default user is for an agent running as root")
def test_a_root_agent_runs_a_teams_job_as_the_teams_own_uid_with_a_scrubbed_environment(clean_servers, tmp_path):
    from .processes import make_cluster, wait_until
    from .rootjobs import ROOT_JOBS, reachable_folder

    cluster = make_cluster(clean_servers, tmp_path)
    for key in ROOT_JOBS:  # the suite's explicit allowance off: the agent's own default
        cluster.base_env.pop(key, None)
    areas = reachable_folder(tmp_path, "areas")
    scheduler = cluster.service("scheduler")
    cluster.agent("r4090-01", AWS_SECRET_ACCESS_KEY="leaked-if-seen", WHALEFLUX_JOB_AREAS=str(areas))
    try:
        scheduler.wait_ready()
        result = cluster.cli("submit", "--gpus", "1", "--team", "vision", "--wait", "--", "sh", "-c",
                             'id -u; echo "${AWS_SECRET_ACCESS_KEY:-none}"; echo "$HOME"; echo "$WHALEFLUX_JOB_ID";'
                             ' pwd', timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        job_id = result.stdout.split("submitted job ")[1].split()[0]
        log = tmp_path / "home" / "jobs" / f"{job_id}.1.log"
        lines = wait_until(lambda: log.exists() and log.read_text().split("\n")[:5], what="the job's log")
        uids = json.loads((tmp_path / "home" / "job-uids.json").read_text())
        area = str(areas / job_id)
        assert lines == [str(uids["vision"]), "none", area, job_id, area]
        assert (areas / job_id).stat().st_uid == uids["vision"] and (areas / job_id).stat().st_mode & 0o777 == 0o700
        assert log.stat().st_mode & 0o777 == 0o600 and log.parent.stat().st_mode & 0o077 == 0
    finally:
        cluster.stop()
