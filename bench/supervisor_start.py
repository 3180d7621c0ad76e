"""A supervisor's start: `python bench/supervisor_start.py [--starts 40] [--rounds 3]`.

Each attempt starts a supervisor process (services/agent/supervise.py), so its start is paid once per job; in the
demo burst (bench/scheduler_burst.py) 300 of them share two cores with the agent and the scheduler. Starts
supervisors one after another, each running `true` in a fresh attempt folder, by the command the agent uses
(`supervise.command`) and, as the reference, by the `python -m whaleflux.agent.supervise` of earlier agents,
alternated; prints the CPU seconds (user + system, the supervisor and its `true`) and the wall time per start.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from time import perf_counter

from whaleflux.agent import attempts, supervise


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _starts(argv_of, root: Path, n: int) -> tuple[float, float]:
    """CPU and wall seconds per start of `n` supervisors, each in a new attempt folder."""
    dirs = []
    for i in range(n):
        attempt_dir = root / f"job-{len(list(root.iterdir()))}-{i}.1"
        attempt_dir.mkdir()
        attempts.write_spec(attempt_dir, attempts.Spec(argv=["true"], env={"PATH": os.environ["PATH"]}, cwd=None,
                                                       alive=str(root / attempts.ALIVE), grace_s=1.0,
                                                       fence_after_s=60.0))
        dirs.append(attempt_dir)
    cpu0, t0 = _children_cpu(), perf_counter()
    for attempt_dir in dirs:
        subprocess.run(argv_of(attempt_dir), check=True, stdin=subprocess.DEVNULL)
    cpu, wall = _children_cpu() - cpu0, perf_counter() - t0
    for attempt_dir in dirs:
        ended = attempts.read_exit(attempt_dir)
        assert ended is not None and ended.exit_code == 0, (attempt_dir, ended)
    return cpu / n, wall / n


def main(n: int, rounds: int) -> None:
    forms = {
        "supervise.command (the agent's)": supervise.command,
        "python -m (reference)": lambda d: [sys.executable, "-m", attempts.SUPERVISOR, str(d)],
    }
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for name, argv_of in forms.items():  # alternated, so a change in load touches both alike
                got[name].append(_starts(argv_of, Path(tmp), n))
    print(f"{n} starts x {rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    for name, runs in got.items():
        cpu = statistics.median(c for c, _ in runs) * 1000
        wall = statistics.median(w for _, w in runs) * 1000
        print(f"  {name:34} CPU {cpu:5.1f} ms/start  wall {wall:5.1f} ms/start  (median of rounds)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.starts, args.rounds)
