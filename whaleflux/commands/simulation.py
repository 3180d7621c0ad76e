"""`whaleflux trace prepare` and `whaleflux simulate`: public job traces replayed through the scheduler's policy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from whaleflux.shared.datafiles import DEFAULT_FLEET

from .terminal import above, bad_option, console, fail, one_of

trace_app = typer.Typer(help="Job traces: turn a public cluster trace into a workload for `simulate`.",
                        no_args_is_help=True)


@trace_app.command("prepare")
def trace_prepare(
    trace: Annotated[Path | None, typer.Argument(
        help="trace file (.csv, .csv.xz, .csv.gz); default: the bundled Philly trace")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="generic job CSV to write")] = Path("jobs.csv"),
    format: Annotated[str, typer.Option("--format", help="philly (timestamp,duration,num_gpus,cluster) or generic "
                                                          "(job_id,submission_time,duration,num_gpu)")] = "philly",
    seed: Annotated[int, typer.Option(help="fills in class, memory, priority and team; same seed, same workload")] = 1,
    time_scale: Annotated[float, typer.Option(
        help="multiply the gaps between submissions: above 1 lightens the load, below 1 raises it")] = 1.0,
    min_duration: Annotated[float, typer.Option(help="drop jobs shorter than this many seconds")] = 60.0,
    max_gpu_hours: Annotated[float, typer.Option(help="drop jobs above this many GPU-hours")] = 1000.0,
) -> None:
    """Write the generic job CSV (job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,
    preemptible)."""
    from whaleflux import traces

    fmt = format.lower()
    one_of("--format", fmt, traces.FORMATS)
    above("--time-scale", time_scale, 0)
    above("--min-duration", min_duration, 0, inclusive=True)
    above("--max-gpu-hours", max_gpu_hours, 0)
    path = trace or traces.PHILLY
    if not path.exists():
        bad_option("TRACE", str(path), "no such trace file")
    try:
        jobs = traces.prepare(traces.read_trace(path, fmt), seed, time_scale, min_duration, max_gpu_hours)
    except traces.TraceError as exc:
        fail(str(exc))
    if not jobs:
        fail(f"no jobs left in {path} after dropping those under {min_duration:g} s or above "
             f"{max_gpu_hours:g} GPU-hours")
    traces.write_csv(jobs, output)
    span_h = jobs[-1].submit_time_s / 3600
    console.print(f"{len(jobs):,} jobs over {span_h:,.1f} h of submissions (seed {seed}, time scale {time_scale:g}) "
                  f"-> {output}", soft_wrap=True)


def simulate(
    jobs: Annotated[Path, typer.Option(
        help="generic job CSV, e.g. from `whaleflux trace prepare` (see shared/data/traces/README.md)")],
    fleet: Annotated[Path, typer.Option(help="fleet file")] = DEFAULT_FLEET,
    # typer copies a list default; it is never mutated
    policy: Annotated[list[str], typer.Option(help="fifo | backfill | whaleflux; repeat to compare")] = ["whaleflux"],  # noqa: B006
    time_scale: Annotated[float, typer.Option(help="stretch the gaps between submissions by this factor")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the reports as JSON")] = False,
    jobs_out: Annotated[Path | None, typer.Option(
        help="write one CSV row per job and policy: submit, first start, finish, JCT, wait, moves, preemptions, "
             "GPU models used")] = None,
    estimate_noise: Annotated[float, typer.Option(
        help="runtime estimates off the true runtime by a seeded log-normal factor of this sigma (0: exact)")] = 0.0,
) -> None:
    """Replay a job trace through the scheduler's queue and placement code on a virtual clock."""
    import json

    from whaleflux.scheduler.queueing import POLICIES
    from whaleflux.scheduler.simulator.metrics import side_by_side, team_rows
    from whaleflux.simulate_view import USABLE_NOTE, report_dict, simulate_with_progress, write_job_rows

    for flag, path in (("--jobs", jobs), ("--fleet", fleet)):
        if not path.is_file():
            bad_option(flag, str(path), "no such file")
    for name in policy:
        one_of("--policy", name.lower(), POLICIES)
    above("--time-scale", time_scale, 0)
    above("--estimate-noise", estimate_noise, 0, inclusive=True)
    try:
        reports = simulate_with_progress(jobs, fleet, [p.lower() for p in policy], time_scale, Console(stderr=True),
                                         estimate_noise)
    except ValueError as exc:
        fail(str(exc))
    if jobs_out is not None:
        written = write_job_rows(reports, jobs_out)
        Console(stderr=True).print(f"{written:,} job rows -> {jobs_out}")
    if json_out:
        print(json.dumps([report_dict(r) for r in reports], indent=2))
        return
    rows = side_by_side(reports)
    table = Table(*rows[0])
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    console.print(USABLE_NOTE, soft_wrap=True)
    for r in reports:
        teams = Table("team", "jobs", "GPU-s share", "mean slowdown", title=f"{r.policy}: per team")
        for row in team_rows(r):
            teams.add_row(*row)
        console.print(teams)
