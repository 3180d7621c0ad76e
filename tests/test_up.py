"""`whaleflux up` on a fresh state folder: all of it comes up, usable with no flags, stops leaving nothing behind."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .processes import wait_until
from .rootjobs import ROOT_JOBS

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _pids_with(marker: bytes) -> set[int]:
    """Processes whose command line or environment contains `marker`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in blob:
            found.add(int(entry.name))
    return found


def test_up_starts_everything_ready_and_sigterm_leaves_no_process(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    # Its output goes to a file, not a pipe nobody reads while it runs (a full pipe would block it).
    out_path = tmp_path / "up.out"
    with open(out_path, "wb") as out_file:
        up = subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out_file,
                              stderr=subprocess.STDOUT)
    try:
        config = home / "config.json"

        def all_ready():
            services = json.loads(config.read_text())["services"]
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        # How fast it comes up is bench/platform_startup.py's business; here only that it does.
        wait_until(all_ready, timeout=180, what="all five services ready")
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        secrets = json.loads(config.read_text())
        assert len(secrets["admin_token"]) >= 32 and len(secrets["nats_password"]) >= 16

        # The CLI finds everything through the config file: no flags.
        cli = [sys.executable, "-m", "whaleflux"]
        done = subprocess.run([*cli, "submit", "--wait", "--", "python", "-c", "print('hi')"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stdout + done.stderr
        assert "exit code 0" in done.stdout and "charged:" in done.stdout, done.stdout
        # Any end ends the wait, with how it ended: a failure with its exit code and its charge...
        failed = subprocess.run([*cli, "submit", "--wait", "--", "python", "-c", "import sys; sys.exit(3)"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert failed.returncode == 1 and ": failed" in failed.stdout and "exit code 3" in failed.stdout, failed.stdout
        assert "charged:" in failed.stdout
        # ...and a job no node could ever hold is refused before it is submitted, with the scheduler's reason.
        never = subprocess.run([*cli, "submit", "--wait", "--gpus", "512", "--nvlink", "--", "true"], env=env,
                               capture_output=True, text=True, timeout=120)
        assert never.returncode == 1, never.stdout + never.stderr
        assert "not submitted: no node could ever run it:" in never.stdout, never.stdout
        assert "submitted job" not in never.stdout
        long = subprocess.run([*cli, "submit", "--", "sleep", "300"], env=env, capture_output=True, text=True,
                              timeout=30)
        job_id = long.stdout.split("submitted job ")[1].split()[0]
        scheduler = secrets["services"]["scheduler"]
        wait_until(lambda: httpx.get(f"{scheduler}/v1/jobs/{job_id}").json()["state"] == "running",
                   what="long job running")

        ours = _pids_with(str(home).encode()) | _pids_with(f"WHALEFLUX_JOB_ID={job_id}".encode())
        ours.discard(up.pid)
        assert len(ours) >= 8  # nats, redis, five services, agent, the job

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=45) == 0
        leftovers = [pid for pid in ours if _alive(pid)]
        assert leftovers == [], f"still running after SIGTERM: {leftovers}"
        output = out_path.read_text()
        assert "WhaleFlux is up" in output and "Stopping WhaleFlux" in output
    finally:
        if up.poll() is None:
            # SIGTERM first: its children run in sessions of their own and outlive a SIGKILLed `up`.
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()


def test_up_holds_each_port_itself_so_nobody_takes_it_and_a_restarted_service_keeps_it(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    with open(tmp_path / "up.out", "wb") as out_file:
        up = subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out_file,
                              stderr=subprocess.STDOUT)
    try:
        config = home / "config.json"

        def all_ready():
            services = json.loads(config.read_text())["services"]
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready")
        services = json.loads(config.read_text())["services"]
        scheduler_port = int(services["scheduler"].rsplit(":", 1)[1])
        [scheduler_pid] = [pid for pid in _pids_with(b"service\0scheduler") if str(home).encode() in
                           Path(f"/proc/{pid}/environ").read_bytes()]
        os.kill(scheduler_pid, signal.SIGKILL)
        # While it is down, the port stays `up`'s: another process cannot bind it.
        with socket.socket() as intruder:
            with pytest.raises(OSError):
                intruder.bind(("127.0.0.1", scheduler_port))
        # `up` restarts it on the same socket: the same address answers, the config file is unchanged.
        wait_until(lambda: not _alive(scheduler_pid), what="scheduler gone")
        wait_until(lambda: httpx.get(services["scheduler"] + "/readyz", timeout=1).status_code == 200, timeout=120,
                   what="scheduler ready again at the same address")
        assert json.loads(config.read_text())["services"] == services
        assert "scheduler exited" in (tmp_path / "up.out").read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def test_local_servers_never_settle_on_a_port_someone_else_took(tmp_path, monkeypatch):
    """A port found free and taken by another process before nats-server or redis-server binds it is not used."""
    import secrets

    import whaleflux.servers as servers

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = taken.getsockname()[1]
    real, calls = servers.free_port, []

    def racy(preferred=None):  # the first answer of each server's search is a port someone takes at once
        calls.append(preferred)
        return held if len(calls) in (1, 3) else real(preferred)

    monkeypatch.setattr(servers, "free_port", racy)
    local = servers.LocalServers(tmp_path / "s", "wf", secrets.token_urlsafe(8), secrets.token_urlsafe(8)).start()
    try:
        assert held not in (local.nats_port, local.redis_port)
        assert len(calls) >= 4  # each server was offered the taken port once, and moved on
    finally:
        local.stop()
        taken.close()


def test_up_runs_jobs_as_its_own_user_with_its_environment_first_on_path_unless_a_job_user_is_set():
    from whaleflux.local import job_defaults

    venv = "/opt/wf/.venv"
    added, said = job_defaults({"PATH": "/usr/bin:/opt/wf/.venv/bin:/bin"}, euid=0, prefix=venv)
    assert added == {"PATH": "/opt/wf/.venv/bin:/usr/bin:/bin", "WHALEFLUX_JOB_USER": "root",
                     "WHALEFLUX_ALLOW_ROOT_JOBS": "true"}  # root's own `up`: its jobs are root's, as it is
    assert said == "as root, who started `up` (WHALEFLUX_JOB_USER names another); /opt/wf/.venv/bin first on PATH"
    nobody = pwd.getpwnam("nobody")
    added, _ = job_defaults({"PATH": "/usr/bin"}, euid=nobody.pw_uid, prefix=venv)
    assert added == {"PATH": "/opt/wf/.venv/bin:/usr/bin", "WHALEFLUX_JOB_USER": "nobody"}
    for configured in ({"WHALEFLUX_JOB_USER": "nobody"}, {"WHALEFLUX_JOB_USERS": '{"vision": "nobody"}'}):
        added, said = job_defaults({"PATH": "/usr/bin", **configured}, euid=0, prefix=venv)
        assert added == {"PATH": "/opt/wf/.venv/bin:/usr/bin"} and said.startswith(f"as {next(iter(configured))}=")
    added, said = job_defaults({"PATH": "/usr/bin", "WHALEFLUX_ALLOW_ROOT_JOBS": "false"}, euid=0, prefix=venv)
    assert added == {"PATH": "/opt/wf/.venv/bin:/usr/bin"} and "each team's own uid" in said


def test_ctrl_c_stops_every_process_in_time_and_names_one_it_had_to_kill(tmp_path):
    """Ctrl-C with a job running: every service ends on its own within its time, except one that cannot (here
    stopped with SIGSTOP, as a hung one would be), which `up` kills and names; no process is left behind."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    out_path = tmp_path / "up.out"
    with open(out_path, "wb") as out_file:
        up = subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out_file,
                              stderr=subprocess.STDOUT)
    try:
        config = home / "config.json"

        def all_ready():
            services = json.loads(config.read_text())["services"]
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready")
        cli = [sys.executable, "-m", "whaleflux"]
        long = subprocess.run([*cli, "submit", "--", "sleep", "300"], env=env, capture_output=True, text=True,
                              timeout=30)
        job_id = long.stdout.split("submitted job ")[1].split()[0]
        scheduler = json.loads(config.read_text())["services"]["scheduler"]
        wait_until(lambda: httpx.get(f"{scheduler}/v1/jobs/{job_id}").json()["state"] == "running",
                   what="long job running")
        ours = _pids_with(str(home).encode()) | _pids_with(f"WHALEFLUX_JOB_ID={job_id}".encode())
        ours.discard(up.pid)
        [billing_pid] = [pid for pid in _pids_with(b"service\0billing") if pid in ours]
        os.kill(billing_pid, signal.SIGSTOP)  # it can no longer act on SIGTERM: `up` must kill it

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        leftovers = [pid for pid in ours if _alive(pid)]
        assert leftovers == [], f"still running after Ctrl-C: {leftovers}"
        output = out_path.read_text()
        assert "billing did not stop within its time; killed it" in output, output
        # Only billing: the scheduler, the other services, the agent and the servers all ended on their own.
        assert "killed (would not stop): billing\n" in output, output
        assert output.count("did not stop within") == 1, output
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
