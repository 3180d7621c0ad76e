#!/usr/bin/env python3
"""CLI start-up: `whaleflux --help`, `whaleflux jobs` and `whaleflux size llama-3-8b` against `python -c pass`.

Each command runs as a fresh process, the four taking turns round after round
(so a change in the machine's load touches them alike); the table gives the
median and the fastest run of each and the median as a multiple of bare
Python start-up in the same run. `jobs` runs against nothing: an empty
WHALEFLUX_HOME and a scheduler URL on a closed local port, so it measures the
imports, the start-up and one refused connection (it exits 1 with its error).

    python bench/cli_startup.py [--runs 21]

Targets (issue 21): --help <= 0.25 s and jobs <= 0.4 s on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path


def _whaleflux() -> list[str]:
    script = Path(sys.executable).parent / "whaleflux"
    return [str(script)] if script.exists() else [sys.executable, "-m", "whaleflux"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: connections are refused at once


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, done.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    args = ap.parse_args()

    wf = _whaleflux()
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
        env.update(WHALEFLUX_HOME=home, WHALEFLUX_SCHEDULER_URL=f"http://127.0.0.1:{_closed_port()}")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "whaleflux --help": [*wf, "--help"],
            "whaleflux jobs (nothing running)": [*wf, "jobs"],
            "whaleflux size llama-3-8b": [*wf, "size", "llama-3-8b"],
        }
        for argv in commands.values():  # warm the file cache and the bytecode once
            _time(argv, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        codes: dict[str, set[int]] = {name: set() for name in commands}
        load_before = os.getloadavg()
        for _ in range(args.runs):
            for name, argv in commands.items():
                seconds, code = _time(argv, env)
                times[name].append(seconds)
                codes[name].add(code)
        load_after = os.getloadavg()

    base = statistics.median(times["python -c pass"])
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.node()}: {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; {args.runs} runs each, interleaved")
    print(f"{'command':36} {'median s':>9} {'fastest s':>10} {'x python':>9}  exit")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:36} {med:9.3f} {min(ts):10.3f} {med / base:9.1f}  {','.join(map(str, sorted(codes[name])))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
