"""A job cannot reach beyond what is its own (issue 36, items 1 and 2): ids, names and the folders it names are
refused when they lead out of its area, the agent creates nothing a job names as root, a symlink out of the area
is refused with nothing outside changing owner, and a job of one team can read neither the environment, the log
nor the area of another team's job."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid

import httpx
import pytest
from pydantic import ValidationError

from whaleflux.agent import attempts, jobarea
from whaleflux.shared import job_paths
from whaleflux.shared.events import JobSubmitted
from whaleflux.shared.job_events import default_name

ROOTS = {"vision": ["/data/vision"], "*": ["/scratch"]}
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="other users' jobs need a root agent")


@pytest.mark.parametrize(("value", "team", "reason"), [
    ("ckpt", "vision", None),
    ("runs/7/ckpt", "nlp", None),
    ("/data/vision/run-7", "vision", None),
    ("/scratch/x", "nlp", None),
    ("../other-job", "vision", "must not contain '..'"),
    ("a/../../b", "vision", "must not contain '..'"),
    ("/data/vision/../../etc", "vision", "must not contain '..'"),
    ("/data/vision-other", "vision", "one of team 'vision''s roots"),
    ("/etc", "nlp", "one of team 'nlp''s roots: /scratch"),
    ("/root/.whaleflux", "ops", "one of team 'ops''s roots"),
    (" ", "vision", "must not be empty"),
])
def test_a_folder_a_job_names_is_its_own_or_refused_with_the_reason(value, team, reason):
    refused = job_paths.refusal(value, team, ROOTS)
    assert refused is None if reason is None else (refused is not None and reason in refused)
    assert str(job_paths.refusal("/etc", "nlp", {})).startswith("absolute paths are not allowed for team 'nlp'")


def test_allowed_roots_must_be_plain_absolute_folders():
    for bad in ({"x": ["relative"]}, {"x": ["/"]}, {"x": ["/a/../b"]}):
        with pytest.raises(ValueError, match=r"WHALEFLUX_TEAM_ROOTS\['x'\]"):
            job_paths.check_roots(bad)


def test_relative_folders_resolve_inside_the_area():
    assert job_paths.resolve(None, "/areas/j1") == "/areas/j1"
    assert job_paths.resolve("ckpt/./a", "/areas/j1") == "/areas/j1/ckpt/a"
    assert job_paths.resolve("/scratch/x", "/areas/j1") == "/scratch/x"


@pytest.mark.parametrize(("field", "value"), [
    ("job_id", ".."), ("job_id", "."), ("job_id", "a/b"), ("job_id", ".hidden"), ("job_id", "x" * 65),
    ("name", ".."), ("name", "a/b"), ("name", "line\nbreak"), ("name", "x" * 129),
    ("team", ".."), ("project", "a/b"), ("workdir", "../up"), ("checkpoint_dir", "a/../../b"),
])
def test_the_contract_refuses_ids_names_and_folders_that_climb(field, value):
    fields = {"job_id": "j1", "name": "train", "command": ["true"], field: value}
    with pytest.raises(ValidationError) as refused:
        JobSubmitted(**fields)
    assert refused.value.errors()[0]["loc"] == (field,)


def test_a_default_name_is_the_command_as_a_name_may_hold_it():
    assert default_name(["python", "/opt/train.py", "--lr", "1e-4"]) == "python opt train.py --lr 1e-4"
    assert default_name(["sh", "-c", "a\nb"]) == "sh -c a b"
    assert default_name(["/"]) == "job" and default_name([".."]) == "job"
    JobSubmitted(job_id="j1", name=default_name(["x" * 300, "/a/b"]), command=["true"])


def test_a_job_area_is_the_jobs_alone_and_refuses_a_planted_file(tmp_path):
    root = tmp_path / "areas"
    area = jobarea.make(str(root), "j1", os.geteuid(), os.getegid())
    assert stat.S_IMODE(os.stat(area).st_mode) == 0o700 and stat.S_IMODE(root.stat().st_mode) == 0o711
    assert jobarea.make(str(root), "j1", os.geteuid(), os.getegid()) == area  # a later attempt: the same area
    (root / "j2").symlink_to(tmp_path)
    with pytest.raises(OSError, match="is not a folder"):
        jobarea.make(str(root), "j2", os.geteuid(), os.getegid())
    for bad in ("..", "a/b", ".x", ""):
        with pytest.raises(OSError, match="cannot name a folder"):
            jobarea.make(str(root), bad, os.geteuid(), os.getegid())


def _supervise(attempt_dir, log):
    with open(log, "ab") as out:
        return subprocess.run([sys.executable, "-m", "whaleflux.agent.supervise", str(attempt_dir)], stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=60)


@as_root
def test_a_checkpoint_symlinked_out_of_the_area_is_refused_and_nothing_outside_changes_owner(tmp_path):
    from .rootjobs import reachable_folder

    areas = reachable_folder(tmp_path, "areas")
    outside = areas.parent / "root-owned"
    outside.mkdir(mode=0o755)
    uid = 61999
    area = jobarea.make(str(areas), "j1", uid, uid)
    os.symlink(outside, os.path.join(area, "checkpoints"))  # as the job could have, on an earlier attempt
    attempt_dir = tmp_path / "attempts" / "j1.1"
    attempt_dir.mkdir(parents=True)
    marker = tmp_path / "ran"
    spec = attempts.Spec(argv=["touch", str(marker)], env={"PATH": os.environ["PATH"]}, cwd=area,
                         alive=str(tmp_path / "alive"), grace_s=5.0, fence_after_s=300.0, user=str(uid), area=area,
                         make=[os.path.join(area, "checkpoints")])
    attempts.write_spec(attempt_dir, spec)
    assert _supervise(attempt_dir, tmp_path / "job.log").returncode == 0
    ended = attempts.read_exit(attempt_dir)
    assert ended is not None and ended.exit_code is None
    assert ended.error is not None and "leads outside the job's area" in ended.error and f"uid {uid}" in ended.error
    assert not marker.exists() and attempts.read_running(attempt_dir) is None
    assert outside.stat().st_uid == 0 and stat.S_IMODE(outside.stat().st_mode) == 0o755


@as_root
def test_a_job_creates_its_folders_as_its_user_and_starts_in_its_area(tmp_path):
    from .rootjobs import reachable_folder

    areas = reachable_folder(tmp_path, "areas")
    uid = 61998
    area = jobarea.make(str(areas), "j1", uid, uid)
    attempt_dir = tmp_path / "attempts" / "j1.1"
    attempt_dir.mkdir(parents=True)
    checkpoint = os.path.join(area, "runs", "ckpt")
    spec = attempts.Spec(argv=["sh", "-c", "pwd; id -u"], env={"PATH": os.environ["PATH"]}, cwd=area,
                         alive=str(tmp_path / "alive"), grace_s=5.0, fence_after_s=300.0, user=str(uid), area=area,
                         make=[checkpoint])
    attempts.write_spec(attempt_dir, spec)
    log = tmp_path / "job.log"
    assert _supervise(attempt_dir, log).returncode == 0
    ended = attempts.read_exit(attempt_dir)
    assert ended is not None and ended.exit_code == 0, log.read_text()
    assert log.read_text().split("\n")[:2] == [area, str(uid)]
    assert os.stat(checkpoint).st_uid == uid and os.stat(os.path.dirname(checkpoint)).st_uid == uid


def test_the_api_refuses_a_folder_not_the_jobs_own_naming_the_field(clean_servers, tmp_path):
    from .processes import ADMIN_TOKEN, make_cluster

    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", WHALEFLUX_TEAM_ROOTS='{"vision": ["/data/vision"]}')
    try:
        scheduler.wait_ready()
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        base = {"name": "train", "command": ["true"], "team": "nlp"}
        for field, value, says in (("checkpoint_dir", "/etc", "checkpoint_dir: absolute paths are not allowed"),
                                   ("workdir", "../../root", "must not contain '..'"),
                                   ("checkpoint_dir", "/data/vision/x", "not allowed for team 'nlp'")):
            answer = httpx.post(f"{scheduler.url}/v1/jobs", json={**base, field: value}, headers=headers, timeout=30)
            assert answer.status_code == 400 and field in answer.text and says in answer.text, answer.text
        name = httpx.post(f"{scheduler.url}/v1/jobs", json={**base, "name": "a/b"}, headers=headers, timeout=30)
        assert name.status_code == 400 and "name" in name.text
        allowed = {**base, "team": "vision", "checkpoint_dir": "/data/vision/run-1"}
        checked = httpx.post(f"{scheduler.url}/v1/jobs/check", json=allowed, headers=headers, timeout=30)
        assert checked.status_code == 200
    finally:
        cluster.stop()


@as_root
def test_a_job_of_one_team_cannot_read_another_teams_environment_log_or_area(clean_servers, tmp_path):
    from .processes import make_cluster, wait_until
    from .rootjobs import ROOT_JOBS, reachable_folder

    cluster = make_cluster(clean_servers, tmp_path)
    for key in ROOT_JOBS:  # the agent's own default: each team its own uid
        cluster.base_env.pop(key, None)
    home = reachable_folder(tmp_path, "home")
    cluster.base_env["WHALEFLUX_HOME"] = str(home)
    areas = home.parent / "areas"
    marker = f"victim-{uuid.uuid4().hex[:8]}"
    scheduler = cluster.service("scheduler")
    cluster.agent("r4090-01", WHALEFLUX_JOB_AREAS=str(areas))
    try:
        scheduler.wait_ready()
        victim = cluster.cli("submit", "--gpus", "1", "--team", "vision", "--env", "VISION_SECRET=s3cr3t", "--",
                             "sh", "-c", f"echo in-the-log > mine; sleep 120; : {marker}", timeout=120)
        assert victim.returncode == 0, victim.stdout + victim.stderr
        victim_id = victim.stdout.split("submitted job ")[1].split()[0]
        victim_log = home / "jobs" / f"{victim_id}.1.log"
        wait_until(lambda: (areas / victim_id / "mine").exists(), timeout=120, what="the victim job running")
        home.chmod(0o755)  # only the logs' own modes stand between the jobs and them now
        # The marker is put together at run time: the probe's own command line must not hold it.
        probe = (f'm={marker[:4]}; m=${{m}}{marker[4:]}; for p in /proc/[0-9]*; do grep -qs $m $p/cmdline || continue;'
                 ' cat $p/environ > /dev/null 2>&1 && echo environ-read || echo environ-denied; done;'
                 f' cat {victim_log} > /dev/null 2>&1 && echo log-read || echo log-denied;'
                 f' ls {areas / victim_id} > /dev/null 2>&1 && echo area-read || echo area-denied;'
                 f' cat {areas / victim_id / "mine"} > /dev/null 2>&1 && echo file-read || echo file-denied')
        attacker = cluster.cli("submit", "--gpus", "1", "--team", "nlp", "--wait", "--", "sh", "-c", probe,
                               timeout=180)
        assert attacker.returncode == 0, attacker.stdout + attacker.stderr
        attacker_id = attacker.stdout.split("submitted job ")[1].split()[0]
        seen = set((home / "jobs" / f"{attacker_id}.1.log").read_text().split())
        assert {"environ-denied", "log-denied", "area-denied", "file-denied"} <= seen, seen
        assert not {"environ-read", "log-read", "area-read", "file-read"} & seen
        cluster.cli("jobs", "cancel", victim_id)
    finally:
        cluster.stop()
        subprocess.run(["pkill", "-f", marker], check=False)
