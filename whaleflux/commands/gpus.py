"""`whaleflux gpus`: every GPU as the scheduler sees it (free, allocated, quarantined and why); cordon and
uncordon one."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

import typer
from rich.table import Table

from whaleflux.client import ClientError, Connection

from .terminal import console, fail, print_table

gpus_app = typer.Typer(help="GPUs as the scheduler sees them: list, cordon, uncordon.", no_args_is_help=True)

STATUSES = ("free", "allocated", "quarantined", "draining", "unavailable")


@gpus_app.command("list")
def gpus_list(
    status: Annotated[str | None, typer.Option(help="only GPUs in this status: " + ", ".join(STATUSES))] = None,
    node: Annotated[str | None, typer.Option(help="only this node")] = None,
) -> None:
    """Every registered GPU: free, allocated (to which job), quarantined (an operator's cordon, or a fault: XID,
    ECC, missing from telemetry), draining (its node drains) or unavailable (its node is lost or unhealthy), why
    and since when; then how many of each."""
    if status is not None and status not in STATUSES:
        raise typer.BadParameter(f"{status!r} is not one of {', '.join(STATUSES)}", param_hint="--status")
    try:
        rows = Connection.discover().get("scheduler", "/v1/gpus", status=status)
    except ClientError as exc:
        fail(str(exc))
    table = Table()
    counts = Counter[str]()
    for col in ("node", "GPU", "model", "status", "job"):
        table.add_column(col, no_wrap=True)
    table.add_column("since", no_wrap=True)
    table.add_column("why", overflow="fold")
    for g in rows:
        if node is not None and g["node"] != node:
            continue
        why = f"{g['cause']}: {g['reason']}" if g.get("cause") else ""
        if g.get("healthy_since"):
            why += f" (healthy since {g['healthy_since'][11:19]})"
        since = (g.get("since") or "")[:19].replace("T", " ")
        table.add_row(g["node"], str(g["index"]), g["model"], g["status"], g.get("job_id") or "", since, why)
        counts[g["status"]] += 1
    print_table(table, "no GPUs" + (f" {status}" if status else ""))
    if counts:
        console.print(", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s] or s in ("free", "quarantined")))


def _post(node: str, gpu: str, action: str, body: dict[str, str]) -> dict[str, Any]:
    try:
        out: dict[str, Any] = Connection.discover().post_admin("scheduler", f"/v1/nodes/{node}/gpus/{gpu}/{action}",
                                                               body)
    except ClientError as exc:
        fail(str(exc))
    return out


@gpus_app.command("cordon")
def gpus_cordon(
    node: Annotated[str, typer.Argument(help="the node, e.g. h100-01")],
    gpu: Annotated[str, typer.Argument(help="the GPU's index on the node (or its UUID)")],
    reason: Annotated[str, typer.Option(help="why, shown by `gpus list` and `jobs why`")] = "cordoned by an operator",
) -> None:
    """Place nothing new on one GPU until `gpus uncordon` (a job on it runs on; undraining the node does not hand it
    back). Needs the admin token."""
    out = _post(node, gpu, "cordon", {"reason": reason})
    console.print(f"{out['node']} GPU {out['gpu']}: cordoned ({out['reason']})", soft_wrap=True)


@gpus_app.command("uncordon")
def gpus_uncordon(
    node: Annotated[str, typer.Argument(help="the node, e.g. h100-01")],
    gpu: Annotated[str, typer.Argument(help="the GPU's index on the node (or its UUID)")],
) -> None:
    """Let a cordoned or quarantined GPU take work again; the ECC errors it has now are accepted (only more
    quarantine it again). Needs the admin token."""
    out = _post(node, gpu, "uncordon", {})
    if out["uncordoned"]:
        console.print(f"{out['node']} GPU {out['gpu']}: uncordoned (was {out['was']})")
    else:
        console.print(f"{out['node']} GPU {out['gpu']}: was not cordoned or quarantined")
