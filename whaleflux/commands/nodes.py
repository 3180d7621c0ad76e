"""`whaleflux nodes`: every node as the scheduler sees it; drain one, undrain it (its GPUs whose critical alert still
fires stay cordoned unless forced)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from whaleflux.client import ClientError, Connection

from .terminal import console, fail, print_table

nodes_app = typer.Typer(help="Nodes as the scheduler sees them: list, drain, undrain.", no_args_is_help=True)


@nodes_app.command("list")
def nodes_list() -> None:
    """Every registered node: model, GPUs free and quarantined, status (healthy, suspect, lost, draining,
    unhealthy) and why."""
    try:
        rows = Connection.discover().get("scheduler", "/v1/nodes")
    except ClientError as exc:
        fail(str(exc))
    table = Table()
    for col in ("node", "cluster", "model", "GPUs", "free", "quarantined", "status"):
        table.add_column(col, no_wrap=True)
    table.add_column("why", overflow="fold")
    for n in rows:
        out = ", ".join(str(i) for i in n["quarantined"])
        table.add_row(n["node"], n["cluster"], n["model"], str(n["gpus"]), str(n["free"]), out, n["status"],
                      escape(n.get("reason") or ""))
    print_table(table, "no nodes registered")


def _post(node: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        out: dict[str, Any] = Connection.discover().post_admin("scheduler", f"/v1/nodes/{node}/{action}", body)
    except ClientError as exc:
        fail(str(exc))
    return out


@nodes_app.command("drain")
def nodes_drain(
    node: Annotated[str, typer.Argument(help="the node, e.g. h100-01")],
    reason: Annotated[str, typer.Option(help="why, shown by `nodes list` and in the requeued jobs' history")]
    = "drained by an operator",
) -> None:
    """Place nothing new on the node and move its jobs elsewhere (stopped there, requeued) until `nodes undrain`.
    Needs an operator's token."""
    out = _post(node, "drain", {"reason": reason})
    console.print(f"{out['node']} draining ({escape(reason)}): its jobs are stopped and requeued", soft_wrap=True)


@nodes_app.command("undrain")
def nodes_undrain(
    node: Annotated[str, typer.Argument(help="the node, e.g. h100-01")],
    force: Annotated[bool, typer.Option(
        "--force", help="also uncordon its GPUs on which a critical alert still fires")] = False,
) -> None:
    """Let a drained node take work again. Its GPUs on which a critical alert still fires stay cordoned (and are
    named) unless --force; an operator's cordon and a fault's quarantine stay in any case (`gpus uncordon`).
    Needs an operator's token."""
    out = _post(node, "undrain", {"force": force})
    # The scheduler's own words ("h100-01 undrained; GPU 3 stays cordoned: GPUTemperatureHigh firing").
    console.print(escape(out["said"]), soft_wrap=True)
    if any(s["cause"] == "alert" for s in out["stays_cordoned"]):
        console.print(f"(it takes work again when its alert resolves; `whaleflux nodes undrain {out['node']} --force` "
                      "hands it back now)", soft_wrap=True, markup=False)
