"""`whaleflux submit`: a job (or a service's replicas) onto the bus, and with --wait its run to the end."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from whaleflux.client import ClientError, Connection

from .jobs import wait_for
from .terminal import console, fail, gpu_model

if TYPE_CHECKING:
    from pydantic import ValidationError

    from whaleflux.shared.events import JobSubmitted


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
    "env": "--env", "workdir": "--workdir", "gpus": "--gpus", "gpu_models": "--model",
    "min_memory_mib": "--min-memory-gb", "expected_runtime_s": "--expected-hours", "workload_class": "--workload",
    "priority": "--priority", "checkpoint_dir": "--checkpoint-dir", "labels": "--label", "service": "--service",
}


# How long `submit` keeps trying a bus that does not answer (a restart, a stall) at most; within JetStream's
# duplicate window (120 s), so a try that was stored unacknowledged is dropped as a duplicate.
PUBLISH_PATIENCE_S = 60.0


def submit(
    command: Annotated[list[str], typer.Argument(metavar="COMMAND", help="the command to run, after --")],
    gpus: Annotated[int, typer.Option(min=1, help="number of GPUs")] = 1,
    model: Annotated[list[str] | None, typer.Option(help="allowed GPU model(s), e.g. H100; default any")] = None,
    min_memory_gb: Annotated[float, typer.Option(min=0, help="minimum memory per GPU, GB")] = 0,
    expected_hours: Annotated[float | None, typer.Option(min=0, help="how long you expect it to run")] = None,
    name: Annotated[str | None, typer.Option(help="job name; default the command")] = None,
    team: str = "default",
    project: str = "default",
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE for the job's environment")] = None,
    workdir: Annotated[str | None, typer.Option(help="working directory of the command on the node")] = None,
    workload: Annotated[Workload, typer.Option(
        case_sensitive=False, help="what kind of work (picks the GPU model that runs it fastest)")] = Workload.small,
    priority: Annotated[Priority, typer.Option(
        case_sensitive=False, help="higher runs first and may preempt lower")] = Priority.normal,
    preemptible: Annotated[bool, typer.Option(help="may be stopped for higher-priority work, then resumed")] = False,
    checkpoint_dir: Annotated[str | None, typer.Option(
        help="WHALEFLUX_CHECKPOINT_DIR; default per job under the agent's home")] = None,
    restart: Annotated[bool, typer.Option(
        "--restart", help="after a preemption or failover start over instead of resuming")] = False,
    nvlink: Annotated[bool, typer.Option(help="all GPUs on one NVLink node (without it, a job larger than any node "
                                              "runs as a gang across nodes)")] = False,
    label: Annotated[list[str] | None, typer.Option(help="placement constraint KEY=VALUE, e.g. pool=onprem")] = None,
    service: Annotated[str | None, typer.Option(help="inference service name (replicas spread across nodes)")] = None,
    replicas: Annotated[int, typer.Option(min=1, max=64, help="inference service replicas: one job each")] = 1,
    restart_on_failure: Annotated[bool, typer.Option(help="requeue the job when it fails")] = False,
    wait: Annotated[bool, typer.Option(help="wait until the job ends and show its cost")] = False,
    retry_for: Annotated[float, typer.Option(
        min=0, max=PUBLISH_PATIENCE_S, help="seconds to keep retrying a bus that does not answer (the same job, "
        "never a copy)")] = PUBLISH_PATIENCE_S,
) -> None:
    """Submit a job:  whaleflux submit --gpus 1 -- python train.py"""
    import uuid

    from whaleflux.shared.job_events import default_name

    models = [_gpu_model(m) for m in model or []]
    environment, labels = _pairs(env, "--env"), _pairs(label, "--label")
    job_id = uuid.uuid4().hex[:12]
    # Replicas of a service are one job each, `<id>-r<i>`, spread across nodes by the scheduler.
    ids = [job_id] if replicas == 1 else [f"{job_id}-r{i}" for i in range(replicas)]
    spec = dict(
        name=name or default_name(command), team=team, project=project, command=command, env=environment,
        workdir=workdir, gpus=gpus, gpu_models=models, min_memory_mib=min_memory_gb * 1024,
        expected_runtime_s=expected_hours * 3600 if expected_hours else None, submitted_by="cli",
        workload_class=workload.value, priority=priority.value, preemptible=preemptible,
        checkpoint_dir=checkpoint_dir, resume="restart" if restart else "checkpoint", nvlink=nvlink, labels=labels,
        service=service or (job_id if replicas > 1 else None), restart_on_failure=restart_on_failure,
    )
    jobs = _job_specs(ids, spec)
    conn = Connection.discover()
    _check(conn, spec)
    _publish(conn, jobs, retry_for)
    for one in jobs:
        console.print(f"submitted job [bold]{one.job_id}[/bold]")
    if wait:
        wait_for(conn, jobs[0].job_id)


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """KEY=VALUE options as a dict; anything else ends the command naming the flag."""
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def _job_specs(ids: list[str], spec: dict[str, Any]) -> list[JobSubmitted]:
    """One validated JobSubmitted per id; a validation error ends the command in the flags' words."""
    from pydantic import ValidationError

    from whaleflux.shared.events import JobSubmitted

    try:
        return [JobSubmitted(job_id=one, **spec) for one in ids]
    except ValidationError as exc:
        fail(flag_error(exc))


def _check(conn: Connection, spec: dict[str, Any]) -> None:
    """Ask the scheduler whether the fleet could ever run the job; an infeasible one ends the command (exit 1)
    with the reason and is not submitted. A scheduler that does not answer only earns a warning: the job
    waits on the bus for it."""
    from whaleflux.client import Unreachable

    body = {k: v for k, v in spec.items() if k != "submitted_by"}
    try:
        answer = conn.post("scheduler", "/v1/jobs/check", body)
    except Unreachable as exc:
        console.print(f"[yellow]warning:[/yellow] not checked against the fleet: {exc}", soft_wrap=True)
        return
    except ClientError as exc:
        fail(str(exc))
    if not answer.get("feasible", True):
        fail(f"not submitted: no node could ever run it: {answer.get('reason')}")


def _publish(conn: Connection, jobs: list[JobSubmitted], retry_for: float) -> None:
    """Publish each job.submitted, trying again while the bus does not answer. Every try publishes the same
    events (job ids fixed before the first, event ids fixed by the job): a try that was stored but not
    acknowledged is dropped by JetStream as a duplicate, and by the scheduler (the job id) past its window."""
    import asyncio

    import nats.errors
    from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

    from whaleflux.client import Unreachable
    from whaleflux.shared import subjects
    from whaleflux.shared.job_events import submitted_event_id

    async def publish() -> None:
        bus = await conn.bus()
        try:
            for one in jobs:
                await bus.publish(subjects.job_submitted(one.team), one, subject=one.job_id,
                                  correlation_id=one.job_id, event_id=submitted_event_id(one.job_id))
        finally:
            await bus.close()

    def waiting(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        console.print(f"[yellow]warning:[/yellow] the bus did not confirm the job ({type(error).__name__}): "
                      f"retrying in {state.upcoming_sleep:.1f} s", soft_wrap=True)

    transient = (Unreachable, TimeoutError, nats.errors.ConnectionClosedError, nats.errors.NoServersError,
                 nats.errors.OutboundBufferLimitError)
    try:
        for attempt in Retrying(retry=retry_if_exception_type(transient), stop=stop_after_delay(retry_for),
                                wait=wait_random_exponential(multiplier=0.5, max=5), before_sleep=waiting,
                                reraise=True):
            with attempt:
                asyncio.run(publish())
    except transient as exc:
        ids = ", ".join(j.job_id for j in jobs)
        fail(f"the bus did not confirm job {ids} in {retry_for:.0f} s ({exc or type(exc).__name__}): it may "
             "still run; see `whaleflux jobs show` before submitting it again")
    except ClientError as exc:
        fail(str(exc))


def _gpu_model(name: str) -> str:
    return gpu_model("--model", name)


def flag_error(exc: ValidationError) -> str:
    """A pydantic validation error of the job spec in the command line's words: the flag, the value, the rule."""
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = SUBMIT_FLAGS.get(field, field or "job")
        value = err.get("input")
        shown = f" {value!r}" if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
        lines.append(f"{flag}{shown}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)
