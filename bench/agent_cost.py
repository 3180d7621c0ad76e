"""Agent cost: CPU and memory of one agent process sampling 8 simulated GPUs at 1 Hz (publishing to real NATS).

    python bench/agent_cost.py [--seconds 60] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from telemetry_harness import server_env, start_servers  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    servers = start_servers()
    env = {**server_env(servers), "WHALEFLUX_INTERVAL_S": str(args.interval), "WHALEFLUX_HTTP_PORT": "0",
           "WHALEFLUX_HOME": tempfile.mkdtemp(prefix="wf-agent-")}
    agent = subprocess.Popen([sys.executable, "-m", "whaleflux", "agent", "--node", "h100-01"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(5)  # start-up (imports, registration) is not the steady cost
        c0, t0 = cpu_s(agent.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_s(agent.pid), time.monotonic()
        rss = rss_mib(agent.pid)
    finally:
        agent.terminate()
        agent.wait(15)
        servers.stop()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"one agent, 8 simulated H100 GPUs, every {args.interval:g} s, {args.seconds:g} s measured: "
          f"CPU {100 * (c1 - c0) / (t1 - t0):.2f} % of one core, RSS {rss:.0f} MiB")
    print("(the issue sets no target for this figure)")


if __name__ == "__main__":
    main()
