"""A full disk on a node is a node fault, not a job failure (issue 36): real agents, scheduler and billing, with a
small tmpfs over one node's attempt store or log directory, filled while a stream of short jobs runs there.

Every job runs once and succeeds, every attempt that ran is billed to its end (its job.finished went out even
where the supervisor could not write its exit), the node says it is unhealthy and why, the jobs go on on another
node, and the node takes work again once space returns. Mounting needs root: the tests skip without it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from whaleflux.agent import attempts, supervise

from .lifecycle import assert_billed_what_ran, assert_ran_once_each, runs, submit, wait_all_ended
from .processes import make_cluster, wait_until

FAULTY, HEALTHY = "a100-01", "h100-01"  # 8 GPUs each (the default fleet)
MODELS = {"gpu_models": ["A100", "H100"]}  # either node will do
STORES = {"attempt store": "attempts", "log directory": "jobs"}  # the reason's name: the folder in WHALEFLUX_HOME


def _mount_tmpfs(where: Path, size: str = "2m") -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)


def _fill(where: Path) -> Path:
    """Write a file in `where` until its file system has no block left; the file, to remove to free it."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        chunk = 64 * 1024
        while chunk:
            try:
                os.write(fd, b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk //= 2
    finally:
        os.close(fd)
    st = os.statvfs(where)
    assert st.f_bavail == 0, st
    return filler


@pytest.fixture
def faulty_home(tmp_path: Path) -> Iterator[Path]:
    """The faulty node's WHALEFLUX_HOME, with a 2 MiB tmpfs over its attempt store and one over its log directory."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs over the agent's folders needs root")
    home = tmp_path / "home-faulty"
    mounted = []
    try:
        for folder in STORES.values():
            _mount_tmpfs(home / folder)
            mounted.append(home / folder)
        yield home
    finally:
        for where in mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _node(scheduler_url: str, name: str) -> dict:
    return next(n for n in httpx.get(scheduler_url + "/v1/nodes", timeout=10).json() if n["node"] == name)


@pytest.mark.parametrize("store", list(STORES))
def test_a_node_whose_disk_fills_under_a_stream_of_jobs_is_unhealthy_and_no_job_runs_twice_or_unbilled(
        clean_servers, tmp_path, faulty_home, store):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", WHALEFLUX_PASS_INTERVAL_S="0.3")
    billing = cluster.service("billing")
    # Its own home (so that only its stores are small), and a minimum free space the 2 MiB tmpfs can hold.
    cluster.agent(FAULTY, name="faulty", WHALEFLUX_HOME=str(faulty_home), WHALEFLUX_MIN_FREE_MIB="0.25")
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        scheduler.wait_ready()
        billing.wait_ready()
        wait_until(lambda: _node(scheduler.url, FAULTY), what="the faulty node registered")
        # A stream: its eight GPUs busy, more queued behind them.
        first = submit(scheduler.url, marks, 2.0, 8, **MODELS)
        wait_until(lambda: all(runs(marks, j) for j in first), what="the first jobs running on the faulty node")
        queued = submit(scheduler.url, marks, 0.3, 8, **MODELS)
        filler = _fill(faulty_home / STORES[store])

        # The node says why it takes no work; the jobs go on elsewhere.
        reason = f"{store}: no space left on device, 0 B free"
        wait_until(lambda: _node(scheduler.url, FAULTY)["status"] == "unhealthy", what="the faulty node unhealthy")
        assert _node(scheduler.url, FAULTY)["reason"] == reason
        cluster.agent(HEALTHY, name="healthy")
        ids = first + queued
        records = wait_all_ended(scheduler.url, ids, timeout=120)
        assert_ran_once_each(marks, ids, records)
        assert_billed_what_ran(billing.url, marks, ids)
        assert {records[j]["node"] for j in queued} & {HEALTHY}, "no queued job ran on the healthy node"
        # None blamed on the job: every job succeeded (above), none with a failure reason of the node's.
        assert _node(scheduler.url, FAULTY)["status"] == "unhealthy"

        # Space returns: the node takes work again on its own.
        filler.unlink()
        wait_until(lambda: _node(scheduler.url, FAULTY)["status"] == "healthy", what="the faulty node healthy again")
        log = (cluster.log_dir / "faulty.log").read_text()
        assert "node.disk_fault" in log and "node.disk_recovered" in log
    finally:
        cluster.stop()


def test_placements_on_a_node_whose_disk_is_already_full_go_back_as_not_started_and_run_elsewhere(
        clean_servers, tmp_path, faulty_home):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", WHALEFLUX_PASS_INTERVAL_S="0.3")
    billing = cluster.service("billing")
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        scheduler.wait_ready()
        billing.wait_ready()
        # Jobs wait for a node; the first to come has a full attempt store: what it is given, it hands back.
        ids = submit(scheduler.url, marks, 0.3, 6, **MODELS)
        _fill(faulty_home / "attempts")
        cluster.agent(FAULTY, name="faulty", WHALEFLUX_HOME=str(faulty_home), WHALEFLUX_MIN_FREE_MIB="0.25")
        wait_until(lambda: _node(scheduler.url, FAULTY)["status"] == "unhealthy", what="the faulty node unhealthy")
        assert _node(scheduler.url, FAULTY)["reason"] == "attempt store: no space left on device, 0 B free"
        cluster.agent(HEALTHY, name="healthy")
        records = wait_all_ended(scheduler.url, ids, timeout=120)
        assert_ran_once_each(marks, ids, records)
        assert_billed_what_ran(billing.url, marks, ids)
        assert {records[j]["node"] for j in ids} == {HEALTHY}
        # Whatever reached the faulty node came back refused as the node's fault, never as the job's failure.
        log = (cluster.log_dir / "faulty.log").read_text()
        assert '"job.failed_to_start"' not in log
        refused = [line for line in log.splitlines() if '"job.refused"' in line]
        assert all("node fault: attempt store: no space left on device" in line for line in refused), refused
    finally:
        cluster.stop()


def test_a_supervisor_whose_attempt_store_is_full_sends_its_start_and_exit_to_the_agent_on_the_pipe(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs over an attempt store needs root")
    store = tmp_path / "attempts"
    _mount_tmpfs(store, "1m")
    try:
        attempt_dir = store / "job-1.1"
        attempt_dir.mkdir()
        spec = attempts.Spec(argv=["sh", "-c", "exit 7"], env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                             alive=str(store / attempts.ALIVE), grace_s=5.0, fence_after_s=300.0)
        attempts.write_spec(attempt_dir, spec)
        _fill(store)
        read_end, write_end = os.pipe()
        env = {**os.environ, attempts.RECORDS_FD: str(write_end)}
        with (tmp_path / "job.log").open("ab") as log:
            supervisor = subprocess.Popen(supervise.command(attempt_dir), env=env, pass_fds=(write_end,), stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(write_end)
        assert supervisor.wait(30) == 0, (tmp_path / "job.log").read_text()
        with os.fdopen(read_end, "rb") as pipe:
            running, ended = attempts.records_of(pipe.read())
        # Neither record fitted on the disk; both reached the agent, with the job's own exit code.
        assert attempts.read_running(attempt_dir) is None and attempts.read_exit(attempt_dir) is None
        assert running is not None and running.supervisor_pid == supervisor.pid
        assert ended is not None and ended.exit_code == 7 and ended.finished_at >= running.started_at
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)
