"""Commands about the GPUs themselves: `monitor` (live view), `sim inject` and `sim clear` (faults in the simulated
fleet)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer

from whaleflux.agent.fault_kinds import FAULT_HELP, PARAMETERS
from whaleflux.client import ClientError, Connection

from .terminal import console, fail, gpu_choice

if TYPE_CHECKING:
    from whaleflux.agent.faults import Fault

sim_app = typer.Typer(help="The simulated fleet: inject faults, clear them.", no_args_is_help=True)


def monitor(
    gpu: Annotated[str, typer.Option(help="all, a GPU index, or a UUID (prefix)")] = "all",
    node: Annotated[str | None, typer.Option(help="only this node")] = None,
    watch: Annotated[bool, typer.Option(help="refresh in place until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="seconds between refreshes with --watch")] = 1.0,
) -> None:
    """Live GPU view: one row per GPU; hot, throttled and erroring GPUs highlighted."""
    from whaleflux.monitor import run as run_monitor

    gpu_choice("--gpu", gpu)
    try:
        code = run_monitor(node, gpu, watch, interval, console)
    except ClientError as exc:
        fail(str(exc))
    raise typer.Exit(code)


# `sim inject`'s option for each parameter of a fault (see services/agent/faults.py FAULT_PARAMS).
OPTION_OF = {"duration_s": "--duration", "leak_mib_per_s": "--leak-rate", "memory_mib": "--memory",
             "crc_errors": "--crc-errors", "cooling_factor": "--cooling-factor", "bits": "--bits", "gpu": "--gpu",
             "node": "--node", "kind": "KIND"}


def fault_from_options(kind: str, node: str, gpu: int | None, params: dict[str, float | int | None]) -> Fault:
    """The fault the options describe; typer.BadParameter (exit 2) naming the option that is wrong for it."""
    if kind not in FAULT_HELP:
        raise typer.BadParameter(f"{kind!r} is not a fault; one of {', '.join(FAULT_HELP)}", param_hint="KIND")
    from pydantic import ValidationError  # here, not at import: `whaleflux --help` stays free of models

    from whaleflux.agent.faults import Fault

    body = {"kind": kind, "node": node, "gpu": gpu, **params}
    try:
        return Fault.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        from whaleflux.client import expected_words

        err = exc.errors()[0]
        message = expected_words(err)
        field = str(err["loc"][0]) if err["loc"] else message.split(":")[0]
        message = message.removeprefix(f"{field}: ")
        # The model's parameter names read as the options that set them.
        message = re.sub(r"\b(" + "|".join(PARAMETERS) + r")\b", lambda m: OPTION_OF[m.group(1)], message)
        raise typer.BadParameter(message, param_hint=OPTION_OF.get(field, field)) from None


@sim_app.command("inject")
def sim_inject(
    kind: Annotated[str, typer.Argument(
        help=" | ".join(FAULT_HELP) + " (the agent's GET /v1/faults says what each does)")],
    node: Annotated[str, typer.Option(help="simulated node, e.g. h100-01")],
    gpu: Annotated[int | None, typer.Option(help="GPU index on the node (every fault but node-silent)")] = None,
    duration: Annotated[float | None, typer.Option(
        help="node-silent only: seconds of silence (default until the agent restarts); GPU faults last until"
             " the agent restarts")] = None,
    leak_rate: Annotated[float | None, typer.Option(
        help="vram-leak only: MiB/s the job's process grows (default 1024)")] = None,
    memory: Annotated[float | None, typer.Option(
        help="foreign-memory only: MiB the foreign process holds (default 65536)")] = None,
    crc_errors: Annotated[int | None, typer.Option(
        help="nvlink-crc only: CRC errors in the burst (default 5000)")] = None,
    cooling_factor: Annotated[float | None, typer.Option(
        help="cooling only: thermal resistance multiplier, over 1 up to 20 (default 3)")] = None,
    bits: Annotated[int | None, typer.Option(
        help="vram-flip only: bits flipped in the cell, 1 or 2 (default 1)")] = None,
) -> None:
    """Inject a fault into the simulated fleet (through the agent's admin endpoint); each kind takes only its own
    parameters."""
    params = {"duration_s": duration, "leak_mib_per_s": leak_rate, "memory_mib": memory, "crc_errors": crc_errors,
              "cooling_factor": cooling_factor, "bits": bits}
    fault = fault_from_options(kind, node, gpu, params)
    try:
        done = Connection.discover().post_admin("agent", "/admin/faults", fault.model_dump(exclude_unset=True))
    except ClientError as exc:
        fail(str(exc))
    console.print(f"injected: {done['injected']}")


@sim_app.command("clear")
def sim_clear(
    node: Annotated[str | None, typer.Argument(help="simulated node, e.g. h100-01")] = None,
    all_nodes: Annotated[bool, typer.Option("--all", help="every node the agent runs")] = False,
) -> None:
    """Undo the faults injected into a simulated node (or every node with --all): a silent node speaks again, each
    faulted GPU is as built (its temperature falls back over the next minute). Alerts resolve by their own rules;
    `nodes undrain` and `gpus uncordon` hand the GPUs back."""
    if (node is None) == (not all_nodes):
        raise typer.BadParameter("name one node, or --all for every node", param_hint="NODE")
    try:
        done = Connection.discover().post_admin("agent", "/admin/faults/clear", {"node": node})
    except ClientError as exc:
        fail(str(exc))
    for name, undone in sorted(done["cleared"].items()):
        if undone or not all_nodes:
            console.print(f"{name}: " + (f"cleared {', '.join(undone)}" if undone else "no injected faults"),
                          soft_wrap=True)
    if all_nodes and not any(done["cleared"].values()):
        console.print("no injected faults on any node")
