#!/usr/bin/env python3
"""How long `whaleflux up` takes to bring all five services to /readyz, and one job's round trip.

Run: python bench/platform_startup.py
Prints: seconds from launch to all five /readyz OK (reference: the foundation issue's
60 s limit), and submit -> succeeded -> charged latency of a trivial job, over 5 jobs.
Uses a throwaway WHALEFLUX_HOME; starts its own nats-server and redis-server.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="wf-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env["WHALEFLUX_HOME"] = str(home)
    started = time.monotonic()
    up = subprocess.Popen(
        [sys.executable, "-m", "whaleflux", "up"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while True:
            try:
                services = json.loads((home / "config.json").read_text())["services"]
                if all(httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES):
                    break
            except (OSError, KeyError, ValueError, httpx.HTTPError):
                pass
            if time.monotonic() - started > 120:
                sys.exit("not ready after 120 s")
            time.sleep(0.1)
        ready_s = time.monotonic() - started
        print(f"all five services ready after {ready_s:.1f} s   (reference: must be <= 60 s)")

        # Wait for the fleet to register before timing jobs.
        while len(httpx.get(services["scheduler"] + "/v1/nodes").json()) < 4:
            time.sleep(0.2)
        rounds = []
        for _ in range(5):
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-m", "whaleflux", "submit", "--wait", "--", "true"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0 and "charged:" in out.stdout, out.stdout + out.stderr
            rounds.append(time.monotonic() - t0)
        print(
            f"submit -> placed -> run -> finished -> charged, via the CLI (incl. its ~0.5 s start-up): "
            f"median {statistics.median(rounds):.2f} s, max {max(rounds):.2f} s over {len(rounds)} jobs"
        )
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)


if __name__ == "__main__":
    main()
