"""Live burst: `python bench/scheduler_burst.py [--jobs 300] [--seconds 1]`.

The demo fleet (four nodes, 28 GPUs) with the scheduler, billing and the agent
as real processes on servers of their own; `--jobs` one-GPU jobs of
`--seconds` each published on NATS at once (as any system may submit). Prints
the time until all finished beside the ideal (jobs x seconds / 28 GPUs, as if
every GPU were busy from the first second to the last), the scheduler's CPU
seconds and per job. Target: within 1.3x the ideal (bar 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lifecycle import own_servers, start_stack  # noqa: E402
from tests.processes import connect_bus  # noqa: E402
from whaleflux.shared import subjects  # noqa: E402
from whaleflux.shared.events import JobSubmitted  # noqa: E402

NODES = ("r4090-01", "a100-01", "h100-01", "h200-01")
GPUS = 28


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def publish(servers, n: int, seconds: float) -> list[str]:
    bus = await connect_bus(servers)
    ids = [f"burst-{i:05d}" for i in range(n)]
    try:
        for job_id in ids:
            data = JobSubmitted(job_id=job_id, name=job_id, team="bench", command=["sleep", str(seconds)])
            await bus.publish(subjects.JOB_SUBMITTED, data, subject=job_id)
    finally:
        await bus.close()
    return ids


def main(n: int, seconds: float) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        own = own_servers(tmp_path)
        cluster, scheduler, _billing = start_stack(own.servers, tmp_path, *NODES)
        try:
            assert scheduler.popen is not None
            pid = scheduler.popen.pid
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            asyncio.run(publish(own.servers, n, seconds))
            posted = time.monotonic() - t0
            while True:
                jobs = httpx.get(
                    scheduler.url + "/v1/jobs", params={"limit": n + 10, "state": "succeeded"}, timeout=30
                ).json()
                if len(jobs) >= n:
                    break
                time.sleep(0.2)
            wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
            ideal = n * seconds / GPUS
            print(f"{n} x {seconds:g} s one-GPU jobs on {GPUS} GPUs (published in {posted:.1f} s)")
            print(
                f"all finished after {wall:.1f} s; ideal {ideal:.1f} s: {wall / ideal:.2f}x   (target <= 1.3x, bar 2x)"
            )
            print(f"scheduler CPU {cpu:.1f} s ({cpu / n * 1000:.0f} ms per job)")
            print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cpus {os.cpu_count()}")
        finally:
            cluster.stop()
            own.local.stop()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    sys.exit(main(args.jobs, args.seconds))
