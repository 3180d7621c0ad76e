"""`whaleflux simulate` with progress: jobs replayed, elapsed and time left, per policy; `--jobs-out` rows.

The simulator (`whaleflux.scheduler.simulator`) has no progress hook; it walks
the job list by index, so the list it gets here notes the furthest index it has
read, which a progress bar in the main thread shows while the replay runs in a
worker thread.
"""

from __future__ import annotations

import csv
import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from whaleflux.scheduler.simulator.metrics import SimReport

if TYPE_CHECKING:
    from whaleflux.scheduler.simulator import SimJob
    from whaleflux.shared.catalog import Fleet

JOB_COLUMNS = ("policy", "job_id", "team", "class", "gpus", "min_vram_gb", "priority", "duration_s", "submit_s",
               "first_start_s", "finish_s", "jct_s", "wait_s", "pending_s", "run_s", "moves", "preemptions", "models",
               "rejected")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def report_dict(report: SimReport) -> dict[str, object]:
    """The report as plain data, without the per-job outcomes (those go to --jobs-out)."""
    out = dataclasses.asdict(report)
    del out["outcomes"]
    return out


def write_job_rows(reports: Sequence[SimReport], path: Path) -> int:
    """One CSV row per job and policy (times in seconds from the trace's start; empty: never); returns rows."""
    tmp = path.with_name(path.name + ".tmp")
    rows = 0
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS)
        for r in reports:
            for o in r.outcomes:
                w.writerow([r.policy, o.job_id, o.team, o.workload_class, o.gpus, f"{o.min_vram_gb:g}", o.priority,
                            _num(o.duration_s), _num(o.submit_s), _num(o.first_start_s), _num(o.finish_s),
                            _num(o.jct_s), _num(o.wait_s), _num(o.pending_s), _num(o.run_s), o.moves, o.preemptions,
                            ";".join(o.models), o.rejected or ""])
                rows += 1
    tmp.replace(path)
    return rows


USABLE_NOTE = (
    "busy utilization, usable GPUs: in each second in which a job waited, the share held of the GPUs some waiting "
    "job could use (model allowed, memory fits). Over all GPUs it counts GPUs no waiting job can use as idle."
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
                           err: Console, estimate_noise: float = 0.0) -> list[SimReport]:
    """Replay the job CSV on the fleet once per policy (as `simulate_files`), showing progress on `err`."""
    from whaleflux.scheduler.simulator.run import check_policies, load_jobs
    from whaleflux.shared.catalog import load_fleet

    try:
        check_policies(policies)
    except ValueError as exc:
        raise ValueError(f"--policy: {exc}") from None
    jobs = load_jobs(jobs_csv, time_scale, estimate_noise)
    fleet = load_fleet(fleet_yaml)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs submitted"),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as progress:
        return [_replay(jobs, fleet, name, f"{name} ({n}/{len(policies)})", progress, err)
                for n, name in enumerate(policies, 1)]


def _replay(jobs: list[SimJob], fleet: Fleet, name: str, label: str, progress: Progress, err: Console) -> SimReport:
    """One policy's replay in a worker thread while the main thread shows how far it has got."""
    from whaleflux.scheduler.queueing import POLICIES
    from whaleflux.scheduler.simulator.engine import simulate
    from whaleflux.scheduler.simulator.fleet import fleet_nodes, interconnects, model_facts

    watched = WatchedJobs(jobs)
    task = progress.add_task(label, total=len(jobs))
    out: dict[str, object] = {}

    def replay() -> None:
        try:
            out["report"] = simulate(watched, fleet_nodes(fleet), POLICIES[name], model_facts(), interconnects())
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
    error = out.get("error")
    if isinstance(error, BaseException):
        raise error
    progress.update(task, completed=len(jobs))
    if not err.is_terminal:
        err.print(f"{name}: done in {time.monotonic() - began:.0f} s")
    report = out["report"]
    assert isinstance(report, SimReport)  # noqa: S101 - set by the worker when it did not raise
    return report
