"""`whaleflux submit --wait` speaks (issue 37 item 4), through a real scheduler and agent: a job no node could
ever hold is refused at submission, naming the largest node and what it lacks (judged by what telemetry saw an
idle card offer, not its nameplate); a waiting job's reason is printed soon after submission, in words, and
again when it changes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import httpx

from whaleflux.shared import subjects
from whaleflux.shared.events import JobSubmitted

from .processes import ADMIN_TOKEN, connect_bus, make_cluster, wait_until

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _idle_known(scheduler, nodes: int) -> bool:
    """Every node registered and sampled: the scheduler knows what each card offers idle."""
    rows = httpx.get(scheduler.url + "/v1/nodes").json()
    return len(rows) == nodes and all(f is not None for r in rows for f in r["memory_free_mib"])


def test_a_job_no_node_could_ever_hold_is_refused_naming_the_largest_node_and_what_it_lacks(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    cluster.agent("h100-01", "r4090-01")
    try:
        scheduler.wait_ready()
        wait_until(lambda: _idle_known(scheduler, 2), what="both nodes registered and sampled")
        # 79.6 GB is below the H100's nameplate (79.65 GB), above what an idle one has free.
        out = cluster.cli("submit", "--wait", "--model", "H100", "--min-memory-gb", "79.6", "--", "true")
        said = out.stdout + out.stderr
        assert out.returncode == 1, said
        assert "not submitted" in said and "the largest node, h100-01 (8 x H100" in said, said
        assert "GPU memory below 79.6 GB (79.4 GB free when idle, of 79.65)" in said, said
        too_many = cluster.cli("submit", "--wait", "--gpus", "16", "--nvlink", "--", "true")
        said = too_many.stdout + too_many.stderr
        assert too_many.returncode == 1 and "lacks: only 8 GPUs per node" in said, said
        assert "the largest node, h100-01 (8 x H100" in said, said
        # Nothing reached the queue; the API refuses the same job with the same words.
        assert httpx.get(scheduler.url + "/v1/jobs").json() == []
        r = httpx.post(scheduler.url + "/v1/jobs", headers=AUTH, json={
            "name": "big", "command": ["true"], "gpu_models": ["H100"], "min_memory_mib": 79.6 * 1024})
        assert r.status_code == 422 and "the largest node, h100-01" in r.json()["detail"], r.text
    finally:
        cluster.stop()


def test_a_queued_job_that_never_fits_an_idle_card_is_rejected_and_keeps_no_one_waiting(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    cluster.agent("h100-01")
    try:
        scheduler.wait_ready()
        wait_until(lambda: _idle_known(scheduler, 1), what="node registered and sampled")
        # Straight onto the bus, as a job that came before the first sample would: no check at submission.
        huge = JobSubmitted(job_id="huge", name="huge", command=["true"], gpu_models=["H100"],
                            min_memory_mib=79.6 * 1024)

        async def publish() -> None:
            bus = await connect_bus(clean_servers)
            try:
                await bus.publish(subjects.job_submitted(huge.team), huge, subject=huge.job_id)
            finally:
                await bus.close()

        asyncio.run(publish())
        r = httpx.post(scheduler.url + "/v1/jobs", headers=AUTH, json={
            "name": "next", "command": ["true"], "gpus": 8, "gpu_models": ["H100"]})
        nxt = r.json()["job_id"]
        rejected = wait_until(lambda: (j := httpx.get(f"{scheduler.url}/v1/jobs/huge").json())["state"] == "rejected"
                              and j, what="the impossible job rejected")
        assert "79.4 GB free when idle" in rejected["reason"], rejected
        assert "the largest node, h100-01 (8 x H100" in rejected["reason"], rejected
        wait_until(lambda: httpx.get(f"{scheduler.url}/v1/jobs/{nxt}").json()["state"] == "succeeded",
                   timeout=60, what="the H100 job after it ran")
    finally:
        cluster.stop()


class Lines:
    """A process's output lines as they come (a thread reads them)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def waiting(self) -> list[str]:
        return [line for line in self.lines if ": waiting: " in line]


def test_submit_wait_prints_why_a_job_waits_and_again_when_the_reason_changes(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    cluster.agent("r4090-01")
    proc = None
    try:
        scheduler.wait_ready()
        wait_until(lambda: _idle_known(scheduler, 1), what="node registered and sampled")
        r = httpx.post(scheduler.url + "/v1/jobs", headers=AUTH, json={
            "name": "blocker", "command": ["sleep", "600"], "gpus": 2, "expected_runtime_s": 3 * 3600})
        blocker = r.json()["job_id"]
        wait_until(lambda: httpx.get(f"{scheduler.url}/v1/jobs/{blocker}").json()["state"] == "running",
                   what="the blocker runs")
        proc = subprocess.Popen([sys.executable, "-m", "whaleflux", "submit", "--wait", "--gpus", "4", "--", "true"],
                                env={**cluster.cli_env(), "PYTHONUNBUFFERED": "1", "COLUMNS": "400"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = Lines(proc)
        first = wait_until(lambda: out.waiting(), timeout=30, what=f"a reason printed: {out.lines}")[0]
        # In words: what it needs, the node its start is reserved on, when (local time, how far off), its place.
        assert "needs 4 GPUs on one node" in first and "reserved to start at " in first, first
        assert "on r4090-01" in first and "(in " in first and " h" in first and "first in line" in first, first
        assert "{at:" not in first and "t=" not in first, first
        job_id = next(line.split()[-1] for line in out.lines if line.startswith("submitted job"))
        # `jobs`, `jobs show` and the console read the same words.
        shown = httpx.get(f"{scheduler.url}/v1/jobs/{job_id}").json()["reason"]
        assert "reserved to start at " in shown and "{at:" not in shown and "(in " in shown, shown
        # An operator cordons a GPU of the node: the reason changes, and is printed again.
        r = httpx.post(f"{scheduler.url}/v1/nodes/r4090-01/gpus/0/cordon", headers=AUTH, json={"reason": "fan"})
        assert r.status_code == 200, r.text
        wait_until(lambda: any("quarantined: r4090-01 GPU 0" in w for w in out.waiting())
                   or any("quarantined: r4090-01 GPU 0" in line for line in out.lines),
                   timeout=30, what=f"the new reason printed: {out.lines}")
        assert len(out.waiting()) >= 2, out.lines
        assert httpx.post(f"{scheduler.url}/v1/jobs/{job_id}/cancel", headers=AUTH).status_code == 200
        assert proc.wait(timeout=30) == 1, out.lines
        assert any(f"{job_id}: cancelled" in line for line in out.lines), out.lines
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.stop()
