"""`whaleflux`: one command line for the whole system."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from whaleflux.shared import subjects
from whaleflux.shared.catalog import DEFAULT_FLEET
from whaleflux.shared.events import JobSubmitted

from .client import ClientError, Connection

app = typer.Typer(help="WhaleFlux: GPU fleet manager.", no_args_is_help=True, pretty_exceptions_enable=False)
jobs_app = typer.Typer(help="List jobs, or show one.", invoke_without_command=True)
app.add_typer(jobs_app, name="jobs")
# Piped output (scripts, logs) gets wide rows instead of wrapped cells.
console = Console(width=None if sys.stdout.isatty() else 200)

SERVICE_NAMES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
TERMINAL = {"succeeded", "failed", "rejected"}


def _fail(message: str) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(1)


@app.command()
def up(fleet: Annotated[Path, typer.Option(help="fleet file to simulate")] = DEFAULT_FLEET) -> None:
    """Run everything locally: NATS, Redis, the five services and a simulated fleet."""
    from .local import up as run_up

    raise typer.Exit(run_up(fleet))


@app.command()
def service(name: Annotated[str, typer.Argument(help="telemetry | scheduler | alerting | billing | inventory")]) -> None:
    """Run one service in the foreground (settings from WHALEFLUX_* environment variables)."""
    if name not in SERVICE_NAMES:
        _fail(f"unknown service {name!r}; choose one of {', '.join(SERVICE_NAMES)}")
    import importlib

    importlib.import_module(f"whaleflux.{name}.app").main()


@app.command()
def agent(
    simulate: Annotated[Path, typer.Option(help="fleet file whose nodes to simulate")] = DEFAULT_FLEET,
    node: Annotated[Optional[list[str]], typer.Option(help="node(s) of the fleet to run; default all")] = None,
) -> None:
    """Run a node agent with simulated GPUs."""
    from whaleflux.agent.app import main as agent_main

    if not simulate.exists():
        _fail(f"fleet file {simulate} does not exist")
    agent_main(simulate, node)


@app.command()
def submit(
    command: Annotated[list[str], typer.Argument(help="the command to run, after --")],
    gpus: Annotated[int, typer.Option(min=1, help="number of GPUs")] = 1,
    model: Annotated[Optional[list[str]], typer.Option(help="allowed GPU model(s), e.g. H100; default any")] = None,
    min_memory_gb: Annotated[float, typer.Option(min=0, help="minimum memory per GPU, GB")] = 0,
    name: Annotated[Optional[str], typer.Option(help="job name; default the command")] = None,
    team: str = "default",
    project: str = "default",
    env: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE for the job's environment")] = None,
    wait: Annotated[bool, typer.Option(help="wait until the job ends and show its cost")] = False,
) -> None:
    """Submit a job:  whaleflux submit --gpus 1 -- python train.py"""
    environment = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--env {item!r}: expected KEY=VALUE")
        environment[key] = value
    job_id = uuid.uuid4().hex[:12]
    try:
        data = JobSubmitted(
            job_id=job_id,
            name=name or " ".join(command)[:128],
            team=team,
            project=project,
            command=command,
            env=environment,
            gpus=gpus,
            gpu_models=model or [],
            min_memory_mib=min_memory_gb * 1024,
            submitted_by="cli",
        )
    except ValueError as exc:
        _fail(str(exc))
    conn = Connection.discover()

    async def _publish() -> None:
        bus = await conn.bus()
        try:
            await bus.publish(subjects.JOB_SUBMITTED, data, subject=job_id, correlation_id=job_id)
        finally:
            await bus.close()

    try:
        asyncio.run(_publish())
    except ClientError as exc:
        _fail(str(exc))
    console.print(f"submitted job [bold]{job_id}[/bold]")
    if wait:
        _wait_for(conn, job_id)


def _wait_for(conn: Connection, job_id: str, timeout_s: float = 3600) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            job = conn.get("scheduler", f"/v1/jobs/{job_id}")
        except ClientError:
            job = None
        state = job["state"] if job else "submitted"
        if state != last:
            where = f" on {job['node']} GPU {','.join(job['gpu_uuids'])}" if job and job.get("node") else ""
            console.print(f"{job_id}: {state}{where}")
            last = state
        if state in TERMINAL:
            if job.get("reason"):
                console.print(f"reason: {job['reason']}")
            _show_cost(conn, job_id)
            raise typer.Exit(0 if state == "succeeded" else 1)
        time.sleep(0.5)
    _fail(f"gave up waiting for {job_id}")


def _show_cost(conn: Connection, job_id: str) -> None:
    for _ in range(20):  # billing may lag the scheduler by a moment
        try:
            for rec in conn.get("billing", f"/v1/costs/jobs/{job_id}"):
                console.print(
                    f"charged: {rec['gpu_seconds']} GPU-s on {rec['gpus']}x {rec['gpu_model']} "
                    f"at ${rec['usd_per_gpu_hour']}/GPU-h = ${rec['cost_usd']}"
                )
            return
        except ClientError:
            time.sleep(0.5)


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
        table.add_row(
            j["job_id"], j["state"], j.get("node") or "", str(j["spec"]["gpus"]), j["spec"]["team"],
            j["spec"]["name"], j["submitted_at"][5:19].replace("T", " "), j.get("reason") or "",
        )
    console.print(table)


@jobs_app.command("show")
def jobs_show(job_id: str) -> None:
    """One job: its spec, where it ran, its exit code and what it cost."""
    conn = Connection.discover()
    try:
        j = conn.get("scheduler", f"/v1/jobs/{job_id}")
    except ClientError as exc:
        _fail(str(exc))
    spec = j["spec"]
    table = Table(show_header=False)
    for key, value in [
        ("id", j["job_id"]), ("name", spec["name"]), ("team / project", f"{spec['team']} / {spec['project']}"),
        ("command", " ".join(spec["command"])), ("state", j["state"]), ("reason", j.get("reason") or ""),
        ("attempt", str(j["attempt"])), ("node", j.get("node") or ""), ("GPU model", j.get("gpu_model") or ""),
        ("GPUs", ", ".join(j["gpu_uuids"])), ("submitted", j["submitted_at"]), ("placed", j.get("placed_at") or ""),
        ("started", j.get("started_at") or ""), ("finished", j.get("finished_at") or ""),
        ("exit code", "" if j.get("exit_code") is None else str(j["exit_code"])),
    ]:
        table.add_row(key, value)
    console.print(table)
    if j["state"] in TERMINAL:
        _show_cost(conn, job_id)


@app.command()
def costs(by: Annotated[str, typer.Option(help="job | team | project | model")] = "team") -> None:
    """Metered GPU-hours and cost."""
    try:
        report = Connection.discover().get("billing", "/v1/costs", by=by)
    except ClientError as exc:
        _fail(str(exc))
    table = Table(by, "jobs", "GPU-hours", "cost (USD)")
    for row in report["rows"]:
        table.add_row(row["key"], str(row["jobs"]), str(row["gpu_hours"]), f"{row['cost_usd']}")
    console.print(table)
    console.print(f"total: ${report['total_usd']}  (reference on-demand prices; see `rates` in /v1/costs)")


@app.command()
def alerts() -> None:
    """Alerts firing now."""
    try:
        rows = Connection.discover().get("alerting", "/v1/alerts")
    except ClientError as exc:
        _fail(str(exc))
    table = Table("since", "severity", "rule", "summary")
    for a in rows:
        table.add_row(a["starts_at"][:19], a["severity"], a["rule"], a["summary"])
    console.print(table)


@app.command()
def inventory() -> None:
    """Registered GPUs by model and status."""
    try:
        rows = Connection.discover().get("inventory", "/v1/summary")
    except ClientError as exc:
        _fail(str(exc))
    table = Table("model", "status", "GPUs")
    for r in rows:
        table.add_row(r["model"], r["status"], str(r["gpus"]))
    console.print(table)


@app.command()
def schemas(
    out: Annotated[Path, typer.Option(help="folder to write to")] = Path("docs/events"),
    check: Annotated[bool, typer.Option(help="only report stale files; exit 1 if any")] = False,
) -> None:
    """Write the JSON Schema of every event (docs/events/)."""
    from whaleflux.shared import schemas as event_schemas

    if check:
        stale = event_schemas.stale(out)
        if stale:
            _fail(f"stale event schemas in {out}: {', '.join(stale)}; run `whaleflux schemas`")
        console.print(f"{out}: up to date")
        return
    for path in event_schemas.write(out):
        console.print(f"wrote {path}")


def main() -> None:
    app()
