"""`whaleflux inventory`, `leases` and `findings`: what the inventory service knows about the GPUs and their cost."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from whaleflux.client import ClientError, Connection

from .terminal import fail, print_table


def _get(path: str, **params: Any) -> Any:
    try:
        return Connection.discover().get("inventory", path, **params)
    except ClientError as exc:
        fail(str(exc))


def inventory(
    by: Annotated[str, typer.Option(help="model | pool | ownership")] = "model",
    hours: Annotated[float, typer.Option(min=0.1, help="window of the mean utilization, hours")] = 24,
) -> None:
    """GPUs by model, pool or ownership: count, missing (node quiet, or gone from telemetry), unhealthy (kept out by
    the scheduler for a fault or an operator's cordon), allocated now, mean utilization while allocated, burnt in;
    then quarantined (by the scheduler, or by their last burn-in), draining (on a node that drains) and free, as
    `whaleflux gpus list` counts them."""
    if by not in ("model", "pool", "ownership"):
        fail(f"--by {by!r}: choose model, pool or ownership")
    rows = _get("/v1/inventory", by=by, hours=hours)
    table = Table(by, "GPUs", "missing", "unhealthy", "allocated", f"mean util while allocated ({hours:g} h)",
                  "burnt in", "quarantined", "draining", "free")
    for r in rows:
        util = "" if r["mean_util_allocated"] is None else f"{r['mean_util_allocated']:.1f}%"
        # An inventory older than the burn-in (or unhealthy) columns answers without them.
        table.add_row(r["key"], str(r["gpus"]), str(r["missing"]), str(r.get("unhealthy", "")), str(r["allocated"]),
                      util, str(r.get("validated", "")), str(r.get("quarantined", "")), str(r.get("draining", "")),
                      str(r.get("free", "")))
    print_table(table, "no GPUs registered")


def lease_days(row: dict[str, Any]) -> tuple[str, str]:
    """(last day covered, last day to give notice), as declared: inclusive days, not the exclusive instants
    `ends_at` and `notice_deadline` (an inventory older than `covered_through`/`notice_by` gives only those: the
    day before each midnight then)."""
    def day_before(instant: str | None) -> str:
        if not instant:
            return ""
        return (datetime.fromisoformat(instant.replace("Z", "+00:00")) - timedelta(microseconds=1)).date().isoformat()

    covered = row.get("covered_through") or day_before(row["ends_at"])
    notice = row.get("notice_by") or day_before(row.get("notice_deadline"))
    return covered, notice


def leases() -> None:
    """Leases: last day covered, days left, last day to give notice, monthly cost, renewal."""
    rows = _get("/v1/leases")
    table = Table("contract", "provider", "state", "GPUs", "covered through", "days left", "give notice by",
                  "monthly cost", "renewal")
    for r in rows:
        renewal = (f"renewed by {r['renewed_by']}" if r["renewed_by"]
                   else "auto-renews" if r["auto_renew"] else "manual")
        covered, notice = lease_days(r)
        if r["notice_days_left"] is not None and r["notice_days_left"] < 0 and r["state"] == "active":
            notice += " (passed)"
        table.add_row(
            r["contract_id"], r["provider"], r["state"], f"{r['gpu_count']} {'/'.join(r['gpu_models'])}",
            covered, f"{r['days_left']:.1f}", notice, f"${r['monthly_cost_usd']}", renewal,
        )
    print_table(table, "no leases declared")


def findings() -> None:
    """Idle allocated GPUs, reserved GPUs idle for days, pools to consolidate, capacity, undeclared GPUs."""
    rows = _get("/v1/findings")
    table = Table("kind", "severity", "finding", "at stake / month")
    for f in rows:
        at_stake = "" if f["monthly_usd"] is None else f"${f['monthly_usd']}"
        table.add_row(f["kind"], f["severity"], f["summary"], at_stake)
    print_table(table, "no findings")
