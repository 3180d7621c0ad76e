"""`whaleflux`: one command line for the whole system."""

from __future__ import annotations

import enum
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from whaleflux.shared.datafiles import DEFAULT_ASSETS, DEFAULT_FLEET

from .client import ClientError, Connection, NotFound

# Start-up time is part of the interface: --help and read commands import only typer, rich and (to make a
# request) httpx. Anything heavier (nats-py, redis, the event models, pydantic models of a service) is imported
# inside the command that needs it. bench/cli_startup.py measures it; tests/test_cli_startup.py guards it.

app = typer.Typer(help="WhaleFlux: GPU fleet manager.", no_args_is_help=True, pretty_exceptions_enable=False)
jobs_app = typer.Typer(help="List jobs, or show one.", invoke_without_command=True)
app.add_typer(jobs_app, name="jobs")
sim_app = typer.Typer(help="The simulated fleet: inject faults.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
# Piped output (scripts, logs) gets wide rows instead of wrapped cells.
console = Console(width=None if sys.stdout.isatty() else 200)

SERVICE_NAMES = ("telemetry", "scheduler", "alerting", "billing", "inventory", "console")
TERMINAL = {"succeeded", "failed", "rejected"}


# The job contract's choices (shared/events.py JobSubmitted; tests/test_cli_errors.py keeps them equal), as
# enums so that the command line lists them and takes any case without importing the event models.
class Workload(str, enum.Enum):
    llm_train = "llm-train"
    finetune = "finetune"
    inference = "inference"
    small = "small"


class Priority(str, enum.Enum):
    high = "high"
    normal = "normal"
    low = "low"


# The job contract's fields as the user wrote them: a validation error names the flag, not the field.
SUBMIT_FLAGS = {
    "job_id": "job id", "name": "--name", "team": "--team", "project": "--project", "command": "the command",
    "env": "--env", "workdir": "--workdir", "gpus": "--gpus", "gpu_models": "--model", "min_memory_mib": "--min-memory-gb",
    "expected_runtime_s": "--expected-hours", "workload_class": "--workload", "priority": "--priority",
    "checkpoint_dir": "--checkpoint-dir", "labels": "--label", "service": "--service",
}


def _print_table(table: Table, empty: str) -> None:
    """The table, or a line saying there is nothing to show (an empty table prints nothing at all)."""
    console.print(table if table.row_count else empty)


def _fail(message: str) -> None:
    # One line whatever its length; brackets in the message are text, not markup.
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def up(
    fleet: Annotated[Path, typer.Option(help="fleet file to simulate")] = DEFAULT_FLEET,
    assets: Annotated[Optional[Path], typer.Option(help="declared ownership and leases; default: the demo fleet's")] = None,
) -> None:
    """Run everything locally: NATS, Redis, the five services and a simulated fleet."""
    from .local import up as run_up

    if assets is None and fleet == DEFAULT_FLEET:
        assets = DEFAULT_ASSETS
    if assets is not None and not assets.exists():
        _fail(f"assets file {assets} does not exist")
    raise typer.Exit(run_up(fleet, assets))


@app.command()
def service(name: Annotated[str, typer.Argument(help="telemetry | scheduler | alerting | billing | inventory | console")]) -> None:
    """Run one service in the foreground (settings from WHALEFLUX_* environment variables)."""
    if name not in SERVICE_NAMES:
        _fail(f"unknown service {name!r}; choose one of {', '.join(SERVICE_NAMES)}")
    import importlib

    _serve_on_handed_socket()
    importlib.import_module(f"whaleflux.{name}.app").main()


def _serve_on_handed_socket() -> None:
    """Serve HTTP on the listening socket `whaleflux up` bound and handed over (WHALEFLUX_HTTP_FD), if any.

    `up` binds each port itself and passes the socket to the process it starts: no moment in which another
    process can take the port, and a restarted service keeps its port. uvicorn serves an inherited socket
    with `fd=`; the service shell has no setting for it, so this makes it uvicorn's default, in this process.
    """
    fd = os.environ.get("WHALEFLUX_HTTP_FD")
    if not fd:
        return
    import uvicorn.config

    init = uvicorn.config.Config.__init__

    def with_fd(self, *args, **kwargs):
        if kwargs.get("fd") is None:  # uvicorn.run passes fd=None explicitly
            kwargs["fd"] = int(fd)
        init(self, *args, **kwargs)

    uvicorn.config.Config.__init__ = with_fd


@app.command()
def agent(
    simulate: Annotated[Path, typer.Option(help="fleet file whose nodes to simulate")] = DEFAULT_FLEET,
    node: Annotated[Optional[list[str]], typer.Option(help="node(s) of the fleet to run; default all")] = None,
    nvml: Annotated[bool, typer.Option(help="this machine's real GPUs through NVML (node name: WHALEFLUX_NODE_NAME or the hostname)")] = False,
) -> None:
    """Run a node agent: simulated GPUs from a fleet file, or --nvml on a real GPU node."""
    from whaleflux.agent.app import main as agent_main

    if not nvml and not simulate.exists():
        _fail(f"fleet file {simulate} does not exist")
    _serve_on_handed_socket()
    agent_main(simulate, node, nvml)


@app.command()
def monitor(
    gpu: Annotated[str, typer.Option(help="all, a GPU index, or a UUID (prefix)")] = "all",
    node: Annotated[Optional[str], typer.Option(help="only this node")] = None,
    watch: Annotated[bool, typer.Option(help="refresh in place until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="seconds between refreshes with --watch")] = 1.0,
) -> None:
    """Live GPU view: one row per GPU; hot, throttled and erroring GPUs highlighted."""
    from .monitor import run as run_monitor

    try:
        code = run_monitor(node, gpu, watch, interval, console)
    except ClientError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


@sim_app.command("inject")
def sim_inject(
    kind: Annotated[str, typer.Argument(help="cooling | ecc-dbe | xid79 | xid48 | nvlink-crc | vram-leak | gpu-vanish | node-silent")],
    node: Annotated[str, typer.Option(help="simulated node, e.g. h100-01")],
    gpu: Annotated[Optional[int], typer.Option(help="GPU index on the node (GPU faults)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="node-silent: seconds; default until the agent restarts")] = None,
) -> None:
    """Inject a fault into the simulated fleet (through the agent's admin endpoint)."""
    body = {"kind": kind, "node": node, "gpu": gpu, "duration_s": duration}
    try:
        done = Connection.discover().post_admin("agent", "/admin/faults", {k: v for k, v in body.items() if v is not None})
    except ClientError as exc:
        _fail(str(exc))
    console.print(f"injected: {done['injected']}")


@app.command()
def submit(
    command: Annotated[list[str], typer.Argument(metavar="COMMAND", help="the command to run, after --")],
    gpus: Annotated[int, typer.Option(min=1, help="number of GPUs")] = 1,
    model: Annotated[Optional[list[str]], typer.Option(help="allowed GPU model(s), e.g. H100; default any")] = None,
    min_memory_gb: Annotated[float, typer.Option(min=0, help="minimum memory per GPU, GB")] = 0,
    expected_hours: Annotated[Optional[float], typer.Option(min=0, help="how long you expect it to run")] = None,
    name: Annotated[Optional[str], typer.Option(help="job name; default the command")] = None,
    team: str = "default",
    project: str = "default",
    env: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE for the job's environment")] = None,
    workdir: Annotated[Optional[str], typer.Option(help="working directory of the command on the node")] = None,
    workload: Annotated[Workload, typer.Option(case_sensitive=False, help="what kind of work (picks the GPU model that runs it fastest)")] = Workload.small,
    priority: Annotated[Priority, typer.Option(case_sensitive=False, help="higher runs first and may preempt lower")] = Priority.normal,
    preemptible: Annotated[bool, typer.Option(help="may be stopped for higher-priority work, then resumed")] = False,
    checkpoint_dir: Annotated[Optional[str], typer.Option(help="WHALEFLUX_CHECKPOINT_DIR; default per job under the agent's home")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="after a preemption or failover start over instead of resuming")] = False,
    nvlink: Annotated[bool, typer.Option(help="all GPUs on one NVLink node (without it, a job larger than any node runs as a gang across nodes)")] = False,
    label: Annotated[Optional[list[str]], typer.Option(help="placement constraint KEY=VALUE, e.g. pool=onprem")] = None,
    service: Annotated[Optional[str], typer.Option(help="inference service name (replicas spread across nodes)")] = None,
    replicas: Annotated[int, typer.Option(min=1, max=64, help="inference service replicas: one job each")] = 1,
    restart_on_failure: Annotated[bool, typer.Option(help="requeue the job when it fails")] = False,
    wait: Annotated[bool, typer.Option(help="wait until the job ends and show its cost")] = False,
) -> None:
    """Submit a job:  whaleflux submit --gpus 1 -- python train.py"""
    import asyncio
    import uuid

    from pydantic import ValidationError

    from whaleflux.shared import subjects
    from whaleflux.shared.events import JobSubmitted

    models = [_gpu_model(m) for m in model or []]
    environment = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--env {item!r}: expected KEY=VALUE")
        environment[key] = value
    labels = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--label {item!r}: expected KEY=VALUE")
        labels[key] = value
    job_id = uuid.uuid4().hex[:12]
    # Replicas of a service are one job each, `<id>-r<i>`, spread across nodes by the scheduler.
    ids = [job_id] if replicas == 1 else [f"{job_id}-r{i}" for i in range(replicas)]
    try:
        jobs = [
            JobSubmitted(
                job_id=one,
                name=name or " ".join(command)[:128],
                team=team,
                project=project,
                command=command,
                env=environment,
                workdir=workdir,
                gpus=gpus,
                gpu_models=models,
                min_memory_mib=min_memory_gb * 1024,
                expected_runtime_s=expected_hours * 3600 if expected_hours else None,
                submitted_by="cli",
                workload_class=workload.value,
                priority=priority.value,
                preemptible=preemptible,
                checkpoint_dir=checkpoint_dir,
                resume="restart" if restart else "checkpoint",
                nvlink=nvlink,
                labels=labels,
                service=service or (job_id if replicas > 1 else None),
                restart_on_failure=restart_on_failure,
            )
            for one in ids
        ]
    except ValidationError as exc:
        _fail(_flag_error(exc))
    data = jobs[0]
    conn = Connection.discover()

    async def _publish() -> None:
        bus = await conn.bus()
        try:
            for one in jobs:
                await bus.publish(subjects.JOB_SUBMITTED, one, subject=one.job_id, correlation_id=one.job_id)
        finally:
            await bus.close()

    try:
        asyncio.run(_publish())
    except ClientError as exc:
        _fail(str(exc))
    for one in jobs:
        console.print(f"submitted job [bold]{one.job_id}[/bold]")
    if wait:
        _wait_for(conn, data.job_id)


def _gpu_model(name: str) -> str:
    """The catalogue key for a model named in any case or by its device name ("h100", "RTX 4090")."""
    from whaleflux.shared.catalog import gpu_models

    catalogue = gpu_models()
    wanted = name.strip().lower()
    for key, spec in catalogue.items():
        if wanted == key.lower() or wanted in (n.lower() for n in spec.names):
            return key
    _fail(f"--model {name}: unknown model {name.upper()} (known: {', '.join(sorted(catalogue))})")


def _flag_error(exc) -> str:
    """A pydantic validation error of the job spec in the command line's words: the flag, the value, the rule."""
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = SUBMIT_FLAGS.get(field, field or "job")
        value = err.get("input")
        shown = f" {value!r}" if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
        lines.append(f"{flag}{shown}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


POLL_S = 0.25  # how often `submit --wait` asks the scheduler: the wait ends within this of the job's end
BILLING_GRACE_S = 5.0  # how long an ended job's charge may take to appear (billing meters from the same events)


def _wait_for(conn: Connection, job_id: str) -> None:
    """Print each state the job passes through; when it ends (any end), how it ended and what it cost."""
    last = None
    try:
        while True:
            try:
                job = conn.get("scheduler", f"/v1/jobs/{job_id}")
            except NotFound:
                job = None  # not yet seen by the scheduler
            except ClientError as exc:
                _fail(f"{exc}; the job goes on: `whaleflux jobs show {job_id}` later")
            state = job["state"] if job else "submitted"
            if state != last:
                where = f" on {job['node']} GPU {','.join(job['gpu_uuids'])}" if job and job.get("node") else ""
                if job and len(job.get("parts") or []) > 1:
                    where = " on " + ", ".join(f"{p['node']} ({len(p['gpu_uuids'])} GPUs)" for p in job["parts"])
                console.print(f"{job_id}: {state}{where}", soft_wrap=True)
                last = state
            if state in TERMINAL:
                _print_end(job)
                _show_cost(conn, job, BILLING_GRACE_S)
                raise typer.Exit(0 if state == "succeeded" else 1)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        console.print(f"stopped waiting; job {job_id} goes on (`whaleflux jobs show {job_id}`)")
        raise typer.Exit(130) from None


def exit_status(code: int | None) -> str | None:
    """An exit code in words: "exit code 3", "killed by SIGKILL", "exit code 143 (128 + SIGTERM)"."""
    import signal

    def name(n: int) -> str:
        try:
            return signal.Signals(n).name
        except ValueError:
            return f"signal {n}"

    if code is None:
        return None
    if code < 0:
        return f"killed by {name(-code)}"
    if code > 128 and code - 128 < signal.NSIG:
        return f"exit code {code} (128 + {name(code - 128)})"
    return f"exit code {code}"


def _print_end(job: dict) -> None:
    status = exit_status(job.get("exit_code"))
    if status:
        console.print(status)
    for p in job.get("parts") or []:
        if len(job["parts"]) > 1 and p.get("exit_code") is not None:
            console.print(f"  rank {p['rank']} on {p['node']}: {exit_status(p['exit_code'])}")
    if job.get("reason"):
        console.print(f"reason: {escape(job['reason'])}", soft_wrap=True)


def _show_cost(conn: Connection, job: dict, wait_s: float = 0.0) -> None:
    """What billing charged for the job: waits up to `wait_s` for an ended job's charge, never for one that never ran."""
    job_id = job["job_id"]
    if not job.get("started_at") and (job.get("attempt") or 0) <= 1:
        console.print("not charged: it never ran")
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            recs = conn.get("billing", f"/v1/costs/jobs/{job_id}")
        except NotFound:
            recs = []
        except ClientError as exc:
            console.print(f"charge: not known ({exc})", soft_wrap=True)
            return
        if recs and all(r.get("ended_at") for r in recs):
            for rec in recs:
                console.print(
                    f"charged: {rec['gpu_seconds']} GPU-s on {rec['gpus']}x {rec['gpu_model']} "
                    f"at ${rec['usd_per_gpu_hour']}/GPU-h = ${rec['cost_usd']}"
                    + (f" (attempt {rec['attempt']})" if len(recs) > 1 else ""), soft_wrap=True
                )
            return
        if time.monotonic() >= deadline:
            console.print(f"charge: not recorded yet; see `whaleflux costs --by job` or `whaleflux jobs show {job_id}`")
            return
        time.sleep(0.2)


@jobs_app.callback()
def jobs(ctx: typer.Context, state: Annotated[Optional[str], typer.Option(help="only jobs in this state")] = None) -> None:
    """List jobs, newest first."""
    if ctx.invoked_subcommand:
        return
    try:
        rows = Connection.discover().get("scheduler", "/v1/jobs", state=state)
    except ClientError as exc:
        _fail(str(exc))
    table = Table()
    for col in ("id", "state", "node", "GPUs", "team"):
        table.add_column(col, no_wrap=True)
    table.add_column("name", max_width=24, overflow="ellipsis", no_wrap=True)
    table.add_column("submitted", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for j in rows:
        node = j.get("node") or ""
        if len(j.get("parts") or []) > 1:
            node += f" +{len(j['parts']) - 1}"  # a gang: its rank-0 node and how many more
        table.add_row(
            j["job_id"], j["state"], node, str(j["spec"]["gpus"]), j["spec"]["team"],
            j["spec"]["name"], j["submitted_at"][5:19].replace("T", " "), j.get("reason") or "",
        )
    _print_table(table, "no jobs" + (f" in state {state}" if state else ""))


@jobs_app.command("show")
def jobs_show(job_id: str) -> None:
    """One job: its spec, where it ran, its exit code and what it cost."""
    conn = Connection.discover()
    try:
        j = conn.get("scheduler", f"/v1/jobs/{job_id}")
    except NotFound:
        _fail(f"no job {job_id}")
    except ClientError as exc:
        _fail(str(exc))
    spec = j["spec"]
    table = Table(show_header=False)
    for key, value in [
        ("id", j["job_id"]), ("name", spec["name"]), ("team / project", f"{spec['team']} / {spec['project']}"),
        ("command", " ".join(spec["command"])), ("state", j["state"]), ("reason", j.get("reason") or ""),
        ("attempt", str(j["attempt"])), ("node", j.get("node") or ""), ("GPU model", j.get("gpu_model") or ""),
        ("GPUs", ", ".join(j["gpu_uuids"])),
        *[(f"rank {p['rank']}", f"{p['node']} ({p['gpu_model']}): {p['state']}"
           + ("" if p.get("exit_code") is None else f", exit code {p['exit_code']}") + f", GPUs {', '.join(p['gpu_uuids'])}")
          for p in j.get("parts") or []],
        ("submitted", j["submitted_at"]), ("placed", j.get("placed_at") or ""),
        ("started", j.get("started_at") or ""), ("finished", j.get("finished_at") or ""),
        ("exit code", "" if j.get("exit_code") is None else str(j["exit_code"])),
    ]:
        table.add_row(key, value)
    console.print(table)
    if j["state"] in TERMINAL:
        _show_cost(conn, j)


@jobs_app.command("why")
def jobs_why(job_id: str) -> None:
    """Why a job waits (what it needs, the largest free block, jobs ahead), or where and why it runs."""
    try:
        answer = Connection.discover().get("scheduler", f"/v1/jobs/{job_id}/why")
    except NotFound:
        _fail(f"no job {job_id}")
    except ClientError as exc:
        _fail(str(exc))
    console.print(f"{job_id}: {answer['state']} (attempt {answer['attempt']})")
    console.print(escape(answer["why"]), soft_wrap=True)


@jobs_app.command("logs")
def jobs_logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new output until the job ends")] = False,
    attempt: Annotated[Optional[int], typer.Option(min=1, help="which attempt; default the latest")] = None,
    node: Annotated[Optional[str], typer.Option(help="a gang spanning nodes: this node's part (default rank 0's)")] = None,
    rank: Annotated[Optional[int], typer.Option(min=0, help="a gang spanning nodes: this rank's part (default 0)")] = None,
) -> None:
    """A job's output. Reads the agent's log files under WHALEFLUX_HOME/jobs, so it works where the agent runs
    (one machine, e.g. `whaleflux up`), not yet for an agent on another host. A gang spanning nodes writes one
    log per node: rank 0's (the coordinator's) by default, another with --rank or --node."""
    from .job_logs import follow_log, latest_attempt, log_path

    conn = Connection.discover()
    record: dict = {}
    unknown = False

    def state() -> tuple[str | None, int | None]:
        nonlocal unknown
        try:
            job = conn.get("scheduler", f"/v1/jobs/{job_id}")
            record.update(job)
            return job["state"], job["attempt"] or None
        except NotFound:
            unknown = True
            return None, None
        except ClientError:
            return None, None

    current, known = state()
    if unknown and latest_attempt(job_id) is None:
        _fail(f"no job {job_id}")
    if node is not None:
        ranks = {p["node"]: p["rank"] for p in record.get("parts") or []} or {record.get("node"): 0}
        if node not in ranks:
            _fail(f"job {job_id} (attempt {known}) has no part on node {node!r}; its nodes: {', '.join(map(str, ranks))}")
        rank = ranks[node]
    rank = rank or 0
    which = attempt or known or latest_attempt(job_id)
    if which is None or not log_path(job_id, which, rank).exists():
        where = log_path(job_id, which or 1, rank).parent
        _fail(f"no log for job {job_id} yet under {where}" + (f" (job is {current})" if current else ""))
    if not follow:
        sys.stdout.write(log_path(job_id, which, rank).read_text(errors="replace"))
        return
    follow_log(job_id, which, state, fixed_attempt=attempt is not None, terminal=TERMINAL, rank=rank)


from .costs_view import costs_app  # noqa: E402  (grouped with its subcommand `tco`)

app.add_typer(costs_app, name="costs")


trace_app = typer.Typer(help="Job traces: turn a public cluster trace into a workload for `simulate`.",
                        no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@trace_app.command("prepare")
def trace_prepare(
    trace: Annotated[Optional[Path], typer.Argument(help="trace file (.csv, .csv.xz, .csv.gz); default: the bundled Philly trace")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="generic job CSV to write")] = Path("jobs.csv"),
    format: Annotated[str, typer.Option("--format", help="philly (timestamp,duration,num_gpus,cluster) or generic (job_id,submission_time,duration,num_gpu)")] = "philly",
    seed: Annotated[int, typer.Option(help="fills in class, memory, priority and team; same seed, same workload")] = 1,
    time_scale: Annotated[float, typer.Option(help="multiply the gaps between submissions: above 1 lightens the load, below 1 raises it")] = 1.0,
    min_duration: Annotated[float, typer.Option(help="drop jobs shorter than this many seconds")] = 60.0,
    max_gpu_hours: Annotated[float, typer.Option(help="drop jobs above this many GPU-hours")] = 1000.0,
) -> None:
    """Write the generic job CSV (job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible)."""
    from . import traces

    fmt = format.lower()
    if fmt not in traces.FORMATS:
        _fail(f"--format {format}: choose one of {', '.join(traces.FORMATS)}")
    if time_scale <= 0:
        _fail(f"--time-scale {time_scale:g}: must be above 0")
    path = trace or traces.PHILLY
    if not path.exists():
        _fail(f"trace {path} does not exist")
    try:
        jobs = traces.prepare(traces.read_trace(path, fmt), seed, time_scale, min_duration, max_gpu_hours)
    except traces.TraceError as exc:
        _fail(str(exc))
    if not jobs:
        _fail(f"no jobs left in {path} after dropping those under {min_duration:g} s or above {max_gpu_hours:g} GPU-hours")
    traces.write_csv(jobs, output)
    span_h = jobs[-1].submit_time_s / 3600
    console.print(f"{len(jobs):,} jobs over {span_h:,.1f} h of submissions (seed {seed}, time scale {time_scale:g}) -> {output}",
                  soft_wrap=True)


@app.command()
def simulate(
    jobs: Annotated[Path, typer.Option(help="generic job CSV, e.g. from `whaleflux trace prepare` (see shared/data/traces/README.md)")],
    fleet: Annotated[Path, typer.Option(help="fleet file")] = DEFAULT_FLEET,
    policy: Annotated[list[str], typer.Option(help="fifo | backfill | whaleflux; repeat to compare")] = ["whaleflux"],
    time_scale: Annotated[float, typer.Option(help="stretch the gaps between submissions by this factor")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the reports as JSON")] = False,
) -> None:
    """Replay a job trace through the scheduler's queue and placement code on a virtual clock."""
    import dataclasses
    import json

    from whaleflux.scheduler.simulator.metrics import side_by_side, team_rows

    from .simulate_view import LITERAL_NOTE, simulate_with_progress

    for path in (jobs, fleet):
        if not path.exists():
            _fail(f"{path} does not exist")
    try:
        reports = simulate_with_progress(jobs, fleet, [p.lower() for p in policy], time_scale, Console(stderr=True))
    except ValueError as exc:
        _fail(str(exc))
    if json_out:
        print(json.dumps([dataclasses.asdict(r) for r in reports], indent=2))
        return
    rows = side_by_side(reports)
    table = Table(*rows[0])
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    console.print(LITERAL_NOTE, soft_wrap=True)
    for r in reports:
        teams = Table("team", "jobs", "GPU-s share", "mean slowdown", title=f"{r.policy}: per team")
        for row in team_rows(r):
            teams.add_row(*row)
        console.print(teams)


alerts_app = typer.Typer(help="Alerts firing now; acknowledge, silence, incidents, notification log.", invoke_without_command=True)
app.add_typer(alerts_app, name="alerts")
silence_app = typer.Typer(help="Mute alerts by label matchers for a while.", invoke_without_command=True)
alerts_app.add_typer(silence_app, name="silence")


def _alerting_get(path: str, **params):
    try:
        return Connection.discover().get("alerting", path, **params)
    except ClientError as exc:
        _fail(str(exc))


def _alerting_post(path: str, body: dict):
    try:
        return Connection.discover().post_admin("alerting", path, body)
    except ClientError as exc:
        _fail(str(exc))


@alerts_app.callback()
def alerts(ctx: typer.Context) -> None:
    """Alerts firing now, with their incident and whether they are acknowledged or muted."""
    if ctx.invoked_subcommand:
        return
    rows = _alerting_get("/v1/alerts")
    table = Table("since", "severity", "rule", "summary", "fingerprint", "incident", "state")
    for a in rows:
        state = "acked" if a.get("acknowledged") else "silenced" if a.get("silenced_by") else "inhibited" if a.get("inhibited") else ""
        table.add_row(a["starts_at"][:19], a["severity"], a["rule"], escape(a["summary"]), a["fingerprint"],
                      a.get("incident") or "", state)
    _print_table(table, "no alerts firing")


@alerts_app.command("ack")
def alerts_ack(
    fingerprint: str,
    by: Annotated[str, typer.Option(help="who acknowledges")] = os.environ.get("USER", "cli"),
    comment: Annotated[str, typer.Option()] = "",
) -> None:
    """Acknowledge a firing alert: no repeats; PagerDuty gets `acknowledge`."""
    _alerting_post(f"/v1/alerts/{fingerprint}/ack", {"by": by, "comment": comment})
    console.print(f"acknowledged {fingerprint}")


@silence_app.callback()
def silences(ctx: typer.Context) -> None:
    """List silences."""
    if ctx.invoked_subcommand:
        return
    table = Table("id", "state", "matchers", "starts", "ends", "by", "comment")
    for s in _alerting_get("/v1/silences"):
        table.add_row(s["id"], s["state"], escape(" ".join(s["matchers"])), s["starts_at"][:19], s["ends_at"][:19],
                      s["created_by"], escape(s["comment"]))
    _print_table(table, "no silences")


@silence_app.command("add")
def silence_add(
    matchers: Annotated[list[str], typer.Argument(help='e.g. Hostname="h100-01" alertname=~"GPU.*"')],
    comment: Annotated[str, typer.Option(help="why")],
    duration: Annotated[str, typer.Option(help="how long: 30m, 2h, 1d")] = "2h",
    author: Annotated[str, typer.Option(help="who")] = os.environ.get("USER", "cli"),
) -> None:
    """Mute alerts whose labels match every matcher, from now for --duration."""
    s = _alerting_post("/v1/silences", {"matchers": matchers, "duration": duration, "created_by": author, "comment": comment})
    console.print(f"silence {s['id']} until {s['ends_at'][:19]}")


@silence_app.command("expire")
def silence_expire(silence_id: str) -> None:
    """End a silence now."""
    _alerting_post(f"/v1/silences/{silence_id}/expire", {})
    console.print(f"expired {silence_id}")


@alerts_app.command("incidents")
def alerts_incidents() -> None:
    """Incidents: correlated alerts, firing count, nodes drained."""
    table = Table("id", "opened", "title", "firing", "members", "open", "drained")
    for i in _alerting_get("/v1/incidents"):
        table.add_row(i["id"], str(i["opened_at"])[:19], escape(i["title"]), str(i["firing"]), str(i["members"]),
                      "yes" if i["open"] else "no", ", ".join(i["drained_nodes"]))
    _print_table(table, "no incidents")


@alerts_app.command("notifications")
def alerts_notifications(
    receiver: Annotated[Optional[str], typer.Option()] = None,
    status: Annotated[Optional[str], typer.Option(help="delivered, rejected, failed, skipped, pending")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
) -> None:
    """The notification log, newest first."""
    table = Table("finished", "receiver", "status", "what", "attempts", "latency ms", "title")
    for e in _alerting_get("/v1/notifications", receiver=receiver, status=status, limit=limit):
        table.add_row(str(e.get("finished_at") or e.get("created_at"))[:19], e["receiver"], e["status"],
                      e["notification_status"], str(e["attempts"]), str(e.get("latency_ms", "")), escape(e.get("title", "")))
    _print_table(table, "no notifications")


@app.command()
def inventory(
    by: Annotated[str, typer.Option(help="model | pool | ownership")] = "model",
    hours: Annotated[float, typer.Option(min=0.1, help="window of the mean utilization, hours")] = 24,
) -> None:
    """GPUs by model, pool or ownership: count, missing, allocated now, mean utilization while allocated."""
    if by not in ("model", "pool", "ownership"):
        _fail(f"--by {by!r}: choose model, pool or ownership")
    try:
        rows = Connection.discover().get("inventory", "/v1/inventory", by=by, hours=hours)
    except ClientError as exc:
        _fail(str(exc))
    table = Table(by, "GPUs", "missing", "allocated", f"mean util while allocated ({hours:g} h)")
    for r in rows:
        util = "" if r["mean_util_allocated"] is None else f"{r['mean_util_allocated']:.1f}%"
        table.add_row(r["key"], str(r["gpus"]), str(r["missing"]), str(r["allocated"]), util)
    _print_table(table, "no GPUs registered")


@app.command()
def leases() -> None:
    """Leases: days left, notice deadline, monthly cost, renewal."""
    try:
        rows = Connection.discover().get("inventory", "/v1/leases")
    except ClientError as exc:
        _fail(str(exc))
    table = Table("contract", "provider", "state", "GPUs", "ends", "days left", "notice by", "monthly cost", "renewal")
    for r in rows:
        renewal = f"renewed by {r['renewed_by']}" if r["renewed_by"] else ("auto-renews" if r["auto_renew"] else "manual")
        notice = (r["notice_deadline"] or "")[:10]
        if r["notice_days_left"] is not None and r["notice_days_left"] < 0 and r["state"] == "active":
            notice += " (passed)"
        table.add_row(
            r["contract_id"], r["provider"], r["state"], f"{r['gpu_count']} {'/'.join(r['gpu_models'])}",
            r["ends_at"][:10], f"{r['days_left']:.1f}", notice, f"${r['monthly_cost_usd']}", renewal,
        )
    _print_table(table, "no leases declared")


@app.command()
def findings() -> None:
    """Idle allocated GPUs, reserved GPUs idle for days, pools to consolidate, capacity, undeclared GPUs."""
    try:
        rows = Connection.discover().get("inventory", "/v1/findings")
    except ClientError as exc:
        _fail(str(exc))
    table = Table("kind", "severity", "finding", "at stake / month")
    for f in rows:
        table.add_row(f["kind"], f["severity"], f["summary"], "" if f["monthly_usd"] is None else f"${f['monthly_usd']}")
    _print_table(table, "no findings")


@app.command()
def schemas(
    out: Annotated[Optional[Path], typer.Option(help="folder to write to; default the checkout's docs/events, wherever you are")] = None,
    check: Annotated[bool, typer.Option(help="only report stale files; exit 1 if any")] = False,
) -> None:
    """Write the JSON Schema of every event (docs/events/)."""
    from whaleflux.shared import schemas as event_schemas

    if out is None:
        # The checkout this CLI runs from (an editable install), not the current folder.
        out = Path(__file__).resolve().parent.parent / "docs" / "events"
        if not out.parent.is_dir():
            _fail(f"no docs/ folder beside this installation ({out.parent.parent}); name one with --out")
    if check:
        stale = event_schemas.stale(out)
        if stale:
            _fail(f"stale event schemas in {out}: {', '.join(stale)}; run `whaleflux schemas`")
        console.print(f"{out}: up to date")
        return
    for path in event_schemas.write(out):
        console.print(f"wrote {path}")


def _count(text: str, option: str, binary: bool) -> int:
    """"8192", "8K" (x1024 when binary, as context lengths go), "100M", "1.5B" (x1000)."""
    units = {"K": 1024 if binary else 1000, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
    raw = text.strip().upper()
    scale = units.get(raw[-1:], 1)
    try:
        value = float(raw[:-1] if scale != 1 else raw) * scale
    except ValueError:
        _fail(f"{option} {text!r}: expected a number such as 8192, 8K, 100M or 1.5B")
    if not 1 <= value < 1e18 or value != int(value):
        _fail(f"{option} {text!r}: expected a whole number of tokens >= 1")
    return int(value)


@app.command()
def size(
    model: Annotated[Optional[str], typer.Argument(help="catalogue model (see --list) or a Hugging Face config.json (file or folder)")] = None,
    task: Annotated[str, typer.Option(help="serve | full | lora | qlora")] = "serve",
    context: Annotated[str, typer.Option(help="tokens per sequence, e.g. 8192 or 8K")] = "4096",
    batch: Annotated[int, typer.Option(help="serve: concurrent sequences; training: micro-batch per replica")] = 1,
    weights: Annotated[Optional[str], typer.Option(help="fp32 | bf16 | fp16 | fp8 | int8 | int4 | nf4 (default bf16; nf4 for qlora)")] = None,
    kv_cache: Annotated[Optional[str], typer.Option(help="serve: KV cache dtype (default bf16)")] = None,
    tokens: Annotated[Optional[str], typer.Option(help="training: dataset tokens per epoch, e.g. 100M")] = None,
    epochs: Annotated[Optional[float], typer.Option(help="training: epochs (default 1)")] = None,
    lora_rank: Annotated[Optional[int], typer.Option(help="lora/qlora: rank (default 16)")] = None,
    lora_targets: Annotated[Optional[str], typer.Option(help="lora/qlora: comma-separated of q,k,v,o,gate,up,down (default all)")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="training: adamw | adamw-8bit | sgd (default adamw)")] = None,
    checkpointing: Annotated[Optional[bool], typer.Option("--checkpointing/--no-checkpointing", help="training: activation checkpointing (default on)")] = None,
    mfu: Annotated[Optional[float], typer.Option(help="training: model FLOPs utilization on an A100 (default 0.40; 0.30 qlora)")] = None,
    gpu: Annotated[Optional[list[str]], typer.Option(help="GPU model(s) to consider; default all in gpu_models.yaml")] = None,
    max_gpus: Annotated[int, typer.Option(help="largest GPU count to consider")] = 64,
    price: Annotated[Optional[list[str]], typer.Option(help="MODEL=USD per GPU-hour instead of the reference price")] = None,
    all_splits: Annotated[bool, typer.Option("--all", help="list every feasible split, not only the fastest per GPU count")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    list_models: Annotated[bool, typer.Option("--list", help="list the catalogue models and exit")] = False,
) -> None:
    """Memory, time and GPUs for serving or fine-tuning an LLM (computed locally; no services needed)."""
    from pydantic import ValidationError

    from whaleflux.shared import sizing

    from .sizing_view import render_catalogue, render_report

    if list_models:
        render_catalogue(console, as_json)
        return
    if model is None:
        _fail("name a model (see `whaleflux size --list`) or a config.json")
    fields: dict = {"model": model}
    try:
        if model.endswith(".json") or Path(model).is_dir() or Path(model).is_file():
            config, label = sizing.read_config_file(model)
            fields = {"config": config, "config_name": label}
        prices = {}
        for item in price or []:
            key, _, usd = item.partition("=")
            try:
                prices[key] = float(usd)
            except ValueError:
                _fail(f"--price {item!r}: expected MODEL=USD, e.g. H100=2.5")
        request = sizing.SizingRequest(
            **fields, task=task, context=_count(context, "--context", binary=True), batch=batch,
            weight_dtype=weights, kv_dtype=kv_cache,
            dataset_tokens=_count(tokens, "--tokens", binary=False) if tokens else None,
            epochs=epochs, lora_rank=lora_rank,
            lora_targets=[t.strip() for t in lora_targets.split(",") if t.strip()] if lora_targets else None,
            optimizer=optimizer, checkpointing=checkpointing, mfu=mfu, gpus=gpu or [], max_gpus=max_gpus,
            prices=prices,
        )
        report = sizing.estimate(request)
    except sizing.SizingError as exc:
        _fail(str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "input"
        _fail(f"{where}: {err['msg']}")
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        render_report(console, report, all_splits)


def main() -> None:
    """The `whaleflux` entry point: the app, with a hint where a usage error has a likely cause."""
    try:
        app()
    except SystemExit as exc:
        argv = sys.argv[1:]
        if exc.code == 2 and argv[:1] == ["submit"] and "--" not in argv:
            # `submit python -c ...`: the job's own options were read as whaleflux's (usage errors exit 2).
            Console(stderr=True).print("hint: put the job's command after `--`, e.g. "
                                       "whaleflux submit --gpus 1 -- python -c \"print('hi')\"", soft_wrap=True,
                                       markup=False, highlight=False)
        raise
