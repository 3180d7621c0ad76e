"""`whaleflux alerts`: alerts firing now; acknowledge, silence, incidents and the notification log."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from whaleflux.client import ClientError, Connection

from .terminal import bad_option, console, fail, one_of, print_table

alerts_app = typer.Typer(help="Alerts firing now; acknowledge, silence, incidents, notification log.",
                         invoke_without_command=True)
silence_app = typer.Typer(help="Mute alerts by label matchers for a while.", invoke_without_command=True)
alerts_app.add_typer(silence_app, name="silence")


NOTIFICATION_STATUSES = ("delivered", "rejected", "failed", "skipped", "pending")


def _get(path: str, **params: Any) -> Any:
    try:
        return Connection.discover().get("alerting", path, **params)
    except ClientError as exc:
        fail(str(exc))


def _post(path: str, body: dict[str, Any]) -> Any:
    try:
        return Connection.discover().post_admin("alerting", path, body)
    except ClientError as exc:
        fail(str(exc))


def _state(alert: dict[str, Any]) -> str:
    if alert.get("acknowledged"):
        return "acked"
    if alert.get("silenced_by"):
        return "silenced"
    return "inhibited" if alert.get("inhibited") else ""


@alerts_app.callback()
def alerts(ctx: typer.Context) -> None:
    """Alerts firing now, with their incident and whether they are acknowledged or muted."""
    if ctx.invoked_subcommand:
        return
    rows = _get("/v1/alerts")
    table = Table("since", "severity", "rule", "summary", "fingerprint", "incident", "state")
    for a in rows:
        table.add_row(a["starts_at"][:19], a["severity"], a["rule"], escape(a["summary"]), a["fingerprint"],
                      a.get("incident") or "", _state(a))
    print_table(table, "no alerts firing")


@alerts_app.command("ack")
def alerts_ack(
    fingerprint: str,
    by: Annotated[str, typer.Option(help="who acknowledges")] = os.environ.get("USER", "cli"),
    comment: Annotated[str, typer.Option()] = "",
) -> None:
    """Acknowledge a firing alert: no repeats; PagerDuty gets `acknowledge`."""
    _post(f"/v1/alerts/{fingerprint}/ack", {"by": by, "comment": comment})
    console.print(f"acknowledged {fingerprint}")


@silence_app.callback()
def silences(ctx: typer.Context) -> None:
    """List silences."""
    if ctx.invoked_subcommand:
        return
    table = Table("id", "state", "matchers", "starts", "ends", "by", "comment")
    for s in _get("/v1/silences"):
        table.add_row(s["id"], s["state"], escape(" ".join(s["matchers"])), s["starts_at"][:19], s["ends_at"][:19],
                      s["created_by"], escape(s["comment"]))
    print_table(table, "no silences")


@silence_app.command("add")
def silence_add(
    matchers: Annotated[list[str], typer.Argument(help='e.g. Hostname="h100-01" alertname=~"GPU.*"')],
    comment: Annotated[str, typer.Option(help="why")],
    duration: Annotated[str, typer.Option(help="how long: 30m, 2h, 1d")] = "2h",
    author: Annotated[str, typer.Option(help="who")] = os.environ.get("USER", "cli"),
) -> None:
    """Mute alerts whose labels match every matcher, from now for --duration."""
    from whaleflux.alerting.config import parse_duration

    try:
        parse_duration(duration)
    except ValueError:
        bad_option("--duration", duration, "expected a duration such as 30m, 2h, 1d or 1h30m")
    s = _post("/v1/silences", {"matchers": matchers, "duration": duration, "created_by": author, "comment": comment})
    console.print(f"silence {s['id']} until {s['ends_at'][:19]}")


@silence_app.command("expire")
def silence_expire(silence_id: str) -> None:
    """End a silence now."""
    _post(f"/v1/silences/{silence_id}/expire", {})
    console.print(f"expired {silence_id}")


@alerts_app.command("incidents")
def alerts_incidents() -> None:
    """Incidents: correlated alerts, firing count, nodes drained."""
    table = Table("id", "opened", "title", "firing", "members", "open", "drained")
    for i in _get("/v1/incidents"):
        table.add_row(i["id"], str(i["opened_at"])[:19], escape(i["title"]), str(i["firing"]), str(i["members"]),
                      "yes" if i["open"] else "no", ", ".join(i["drained_nodes"]))
    print_table(table, "no incidents")


@alerts_app.command("notifications")
def alerts_notifications(
    receiver: Annotated[str | None, typer.Option()] = None,
    status: Annotated[str | None, typer.Option(help=", ".join(NOTIFICATION_STATUSES))] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
) -> None:
    """The notification log, newest first."""
    one_of("--status", status, NOTIFICATION_STATUSES)
    table = Table("finished", "receiver", "status", "what", "attempts", "latency ms", "title")
    for e in _get("/v1/notifications", receiver=receiver, status=status, limit=limit):
        table.add_row(str(e.get("finished_at") or e.get("created_at"))[:19], e["receiver"], e["status"],
                      e["notification_status"], str(e["attempts"]), str(e.get("latency_ms", "")),
                      escape(e.get("title", "")))
    print_table(table, "no notifications")
