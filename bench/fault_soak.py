"""Fault soak: `python bench/fault_soak.py [--jobs 500]`.

The demo fleet (four nodes, 28 GPUs) with the scheduler, billing and the
agent as real processes on servers of its own, `--jobs` short jobs that write
their own start and end marks, and while they run each component in turn is
killed and restarted: the scheduler (kill -9), billing (kill -9), the agent
(kill -9), Redis (FLUSHALL), nats-server (restart). Prints submitted /
succeeded / ran twice / stuck / billed vs ran. Target: 0 ran twice, 0 stuck,
billed within 1% of what ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lifecycle import billed_gpu_seconds, own_servers, runs, start_stack, submit  # noqa: E402
from tests.processes import Proc  # noqa: E402

NODES = ("r4090-01", "a100-01", "h100-01", "h200-01")


def restart(proc: Proc, ready: bool) -> None:
    """kill -9 a process and start it again (waiting until it is ready, for a service)."""
    proc.kill9()
    if ready:
        proc.start().wait_ready(60)
    else:
        time.sleep(2)
        proc.start()


def main(n_jobs: int, seconds: float) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        own = own_servers(tmp_path)
        marks = tmp_path / "marks"
        marks.mkdir()
        cluster, scheduler, billing = start_stack(own.servers, tmp_path, *NODES)
        agent = cluster.procs["agent"]
        started = time.monotonic()
        try:
            ids = submit(scheduler.url, marks, seconds, n_jobs)
            faults = [
                ("scheduler kill -9", lambda: restart(scheduler, ready=True)),
                ("billing kill -9", lambda: restart(billing, ready=True)),
                ("agent kill -9", lambda: restart(agent, ready=False)),
                ("redis FLUSHALL", own.flushall),
                ("nats-server restart", own.restart_nats),
            ]
            for name, fault in faults:
                time.sleep(max(2.0, seconds * 2))
                print(f"{time.monotonic() - started:6.1f} s  {name}", flush=True)
                fault()
            deadline = time.monotonic() + max(300.0, n_jobs * seconds / 10)
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                try:
                    got = httpx.get(scheduler.url + "/v1/jobs", params={"limit": 1000}, timeout=10)
                except httpx.HTTPError:
                    got = None
                if got is not None and got.status_code == 200:
                    states = {j["job_id"]: j["state"] for j in got.json()}
                    if all(states.get(i) in ("succeeded", "failed", "rejected") for i in ids):
                        break
                time.sleep(1.0)
            elapsed = time.monotonic() - started
            succeeded = sum(1 for i in ids if states.get(i) == "succeeded")
            stuck = sum(1 for i in ids if states.get(i) not in ("succeeded", "failed", "rejected"))
            twice = sum(1 for i in ids if len([r for r in runs(marks, i) if r.end is not None and not r.stopped]) > 1)
            overlap = sum(
                1
                for i in ids
                if any(a.end is None or a.end > b.start
                       for a, b in zip(runs(marks, i), runs(marks, i)[1:], strict=False))
            )
            ran = sum(r.end - r.start for i in ids for r in runs(marks, i) if r.end is not None)
            time.sleep(3.0)  # billing's last reports
            billed = sum(float(billed_gpu_seconds(billing.url, i)) for i in ids)
            print(
                f"submitted {len(ids)} / succeeded {succeeded} / ran twice {twice} / overlapping attempts {overlap} / "
                f"stuck {stuck}   (target: ran twice 0, stuck 0)"
            )
            print(
                f"billed {billed:.1f} GPU-s vs ran {ran:.1f} GPU-s by the jobs' own marks: "
                f"{(billed - ran) / ran * 100 if ran else 0:+.2f}%   (target: within 1%)"
            )
            print(
                f"wall {elapsed:.0f} s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
                f"cpus {os.cpu_count()}"
            )
            return 0 if not twice and not stuck and abs(billed - ran) <= 0.01 * ran else 1
        finally:
            cluster.stop()
            own.local.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each job runs")
    args = ap.parse_args()
    sys.exit(main(args.jobs, args.seconds))
