"""Commands about the GPUs themselves: `monitor` (live view) and `sim inject` (faults in the simulated fleet)."""

from __future__ import annotations

from typing import Annotated

import typer

from whaleflux.client import ClientError, Connection

from .terminal import console, fail

sim_app = typer.Typer(help="The simulated fleet: inject faults.", no_args_is_help=True)


def monitor(
    gpu: Annotated[str, typer.Option(help="all, a GPU index, or a UUID (prefix)")] = "all",
    node: Annotated[str | None, typer.Option(help="only this node")] = None,
    watch: Annotated[bool, typer.Option(help="refresh in place until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="seconds between refreshes with --watch")] = 1.0,
) -> None:
    """Live GPU view: one row per GPU; hot, throttled and erroring GPUs highlighted."""
    from whaleflux.monitor import run as run_monitor

    try:
        code = run_monitor(node, gpu, watch, interval, console)
    except ClientError as exc:
        fail(str(exc))
    raise typer.Exit(code)


@sim_app.command("inject")
def sim_inject(
    kind: Annotated[str, typer.Argument(
        help="cooling | ecc-dbe | xid79 | xid48 | nvlink-crc | vram-leak | gpu-vanish | node-silent")],
    node: Annotated[str, typer.Option(help="simulated node, e.g. h100-01")],
    gpu: Annotated[int | None, typer.Option(help="GPU index on the node (GPU faults)")] = None,
    duration: Annotated[float | None, typer.Option(
        help="node-silent: seconds; default until the agent restarts")] = None,
) -> None:
    """Inject a fault into the simulated fleet (through the agent's admin endpoint)."""
    body = {"kind": kind, "node": node, "gpu": gpu, "duration_s": duration}
    try:
        done = Connection.discover().post_admin("agent", "/admin/faults",
                                                {k: v for k, v in body.items() if v is not None})
    except ClientError as exc:
        fail(str(exc))
    console.print(f"injected: {done['injected']}")
