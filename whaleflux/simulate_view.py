"""`whaleflux simulate` with progress: jobs replayed, elapsed and time left, per policy.

The simulator (`whaleflux.scheduler.simulator`) has no progress hook; it walks
the job list by index, so the list it gets here notes the furthest index it has
read, which a progress bar in the main thread shows while the replay runs in a
worker thread.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LITERAL_NOTE = (
    "busy utilization (literal) is the formula read literally: every allocated GPU-second, also those while no job "
    "waited, over fleet GPUs x seconds in which a job waited; it exceeds 1 when GPUs stay busy after the queue "
    "empties. busy utilization counts only the GPU-seconds while a job waited."
)


class WatchedJobs(list):
    """A list that remembers the furthest index read: how far the replay has got through the submissions."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self.reached = 0

    def __getitem__(self, index):
        if isinstance(index, int) and index >= self.reached:
            self.reached = index + 1
        return super().__getitem__(index)


def simulate_with_progress(jobs_csv: Path, fleet_yaml: Path, policies: list[str], time_scale: float,
                           err: Console) -> list:
    """Replay the job CSV on the fleet once per policy (as `simulate_files`), showing progress on `err`."""
    from whaleflux.scheduler.queueing import POLICIES
    from whaleflux.scheduler.simulator.engine import simulate
    from whaleflux.scheduler.simulator.fleet import fleet_nodes, interconnects, model_facts
    from whaleflux.scheduler.simulator.workload import read_jobs
    from whaleflux.shared.catalog import load_fleet

    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"--policy {', '.join(unknown)}: choose from {', '.join(POLICIES)}")
    jobs = read_jobs(jobs_csv, time_scale)
    fleet = load_fleet(fleet_yaml)
    facts, links = model_facts(), interconnects()
    reports = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs submitted"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as progress:
        for n, name in enumerate(policies, 1):
            watched = WatchedJobs(jobs)
            task = progress.add_task(f"{name} ({n}/{len(policies)})", total=len(jobs))
            out: dict = {}

            def replay() -> None:
                try:
                    out["report"] = simulate(watched, fleet_nodes(fleet), POLICIES[name], facts, links)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
                    out["error"] = exc

            worker = threading.Thread(target=replay, name=f"simulate-{name}", daemon=True)
            began = time.monotonic()
            worker.start()
            next_line = 0.1
            while worker.is_alive():
                worker.join(0.5)
                progress.update(task, completed=min(watched.reached, len(jobs)))
                done = watched.reached / max(len(jobs), 1)
                if not err.is_terminal and done >= next_line:  # logs and pipes: a line per tenth
                    err.print(f"{name}: {watched.reached:,}/{len(jobs):,} jobs submitted "
                              f"({done:.0%}, {time.monotonic() - began:.0f} s)")
                    next_line = int(done * 10) / 10 + 0.1
            if "error" in out:
                raise out["error"]
            progress.update(task, completed=len(jobs))
            if not err.is_terminal:
                err.print(f"{name}: done in {time.monotonic() - began:.0f} s")
            reports.append(out["report"])
    return reports
