"""`whaleflux costs`: chargeback tables, exports and the TCO comparison, from the billing service over HTTP."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from whaleflux.client import ClientError, Connection, refusal

from .terminal import amount, console, gpu_model, instant, one_of

GROUPINGS = ("job", "team", "project", "model")  # billing's GroupBy
costs_app = typer.Typer(help="GPU cost per job, team or project; idle; exports; TCO.", invoke_without_command=True)

def _fail(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)

def _get_text(conn: Connection, path: str, params: dict) -> str:
    """GET a non-JSON body (CSV) from billing; the service's message becomes the error."""
    import httpx  # here, not at the top: `whaleflux --help` does not need it

    url = conn.services["billing"] + path
    try:
        resp = httpx.get(url, params={k: v for k, v in params.items() if v is not None}, headers=conn.auth(),
                         timeout=60)
    except httpx.HTTPError as exc:
        raise ClientError(
            f"cannot reach the billing service at {conn.services['billing']} ({type(exc).__name__})") from None
    if resp.status_code >= 400:
        raise ClientError(refusal("billing", resp))
    return resp.text

def _eff(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}%"

@costs_app.callback()
def costs(
    ctx: typer.Context,
    by: Annotated[str, typer.Option(help="job | team | project | model")] = "team",
    from_: Annotated[str | None, typer.Option(
        "--from", help="start: YYYY-MM-DD or YYYY-MM-DDTHH:MM, UTC unless +HH:MM is given (default: start of this "
                       "month)")] = None,
    to: Annotated[str | None, typer.Option(help="end, as --from (default: now)")] = None,
    share_idle: Annotated[bool, typer.Option(help=(
        "share idle cost back in proportion to use (with --export focus: FOCUS 1.3 split cost allocation rows "
        "per team or project)"))] = False,
    export: Annotated[str | None, typer.Option(help="focus | csv | json: print the export instead of tables")] = None,
    running: Annotated[bool, typer.Option(help="include jobs still running, at their cost up to now (marked)")] = True,
) -> None:
    """Cost per job, team, project or model over a window, the idle line per pool and model, and the fleet total."""
    if ctx.invoked_subcommand:
        return
    one_of("--by", by, GROUPINGS)
    one_of("--export", export, ("focus", "csv", "json"))
    if export == "focus" and share_idle and by not in ("team", "project"):
        _fail("--export focus --share-idle: idle is split cost allocated to teams or projects; give --by team or "
              "--by project")
    window = {"from": instant("--from", from_), "to": instant("--to", to)}
    conn = Connection.discover()
    try:
        if export:
            split = {"share_idle_by": by} if share_idle and export == "focus" else {}
            sys.stdout.write(_get_text(conn, "/v1/costs/export", {"format": export, "by": by, **split, **window}))
            return
        report = conn.get("billing", "/v1/costs", by=by, share_idle=str(share_idle).lower(),
                          running=str(running).lower(), **window)
    except ClientError as exc:
        _fail(str(exc))
    _print_report(conn, report, by, share_idle, running)


def _print_report(conn: Connection, report: dict[str, Any], by: str, share_idle: bool, running: bool) -> None:
    """The rows per job/team/..., what is still running, the idle table, the fleet total and the pricing notes."""
    live = _running_jobs(conn) if running else None
    table = Table(title=f"Cost by {by}, {report['from'][:16]} to {report['to'][:16]} UTC")
    # `jobs` counts distinct jobs in a row: one per row when the rows are jobs, so not shown then.
    columns = [by, *([] if by == "job" else ["jobs"]), "GPU-hours", "cost (USD)",
               *(["idle share", "total"] if share_idle else []), "GPU util while allocated"]
    for col in columns:
        table.add_column(col, justify="left" if col == by else "right")
    for r in report["rows"]:
        key = escape(r["key"]) + (" [yellow](running)[/yellow]" if by == "job" and live and r["key"] in live else "")
        cells = [key, *([] if by == "job" else [str(r["jobs"])]), r["gpu_hours"], f"${r['cost_usd']}"]
        if share_idle:
            cells += [f"${r['idle_share_usd']}", f"${r['total_usd']}"]
        table.add_row(*cells, _eff(report["efficiency_pct"].get(r["key"])))
    console.print(table if table.row_count else "no GPU time charged in this window")
    if live and by != "job":
        console.print(f"includes {len(live)} job(s) still running, at their cost up to now")
    elif not running and report["totals"].get("running_usd") not in (None, "0", "0.00"):
        console.print(f"jobs still running, not in the rows: ${report['totals']['running_usd']} so far "
                      "(--running shows them)")
    if report["idle"]:
        console.print(_idle_table(report["idle"]))
    console.print(fleet_identity(report["totals"], share_idle))
    pricing = report["pricing"]
    console.print(f"prices: {escape(pricing['inventory']['basis'])}; price book: {escape(pricing['pricebook'])}")
    for note in group_notes(pricing["notes"]):
        console.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=True)


def fleet_identity(t: dict[str, Any], share_idle: bool) -> str:
    """The fleet total as billing adds it up: fleet = allocated + running + idle + rounding (docs/services/billing.md,
    rounding rule). Shared back, idle is the rows' shares plus what stays unshared. Every term is a shown amount."""
    from decimal import Decimal

    terms = [("allocated", Decimal(t["allocated_usd"]))]
    if share_idle:
        unshared = Decimal(t["unshared_idle_usd"])
        terms += [("idle shared back", Decimal(t["idle_usd"]) - unshared), ("idle not shared", unshared)]
    else:
        terms.append(("idle", Decimal(t["idle_usd"])))
    running = Decimal(t.get("running_usd") or 0)
    # Attempts still running are a line of their own unless they are rows (then that line is 0).
    if running or not t.get("running_as_rows", False):
        terms.append(("running", running))
    terms.append(("rounding", Decimal(t.get("rounding_usd") or 0)))
    out = f"fleet ${t['fleet_usd']} = {terms[0][0]} ${terms[0][1]:.2f}"
    for name, usd in terms[1:]:
        out += f" {'-' if usd < 0 else '+'} {name} ${abs(usd):.2f}"
    return out


def _idle_table(lines: list[dict[str, Any]]) -> Table:
    idle = Table(title="Fleet and idle per pool and model")
    for col in ("pool", "model", "ownership", "GPUs", "fleet", "allocated", "idle", "idle %"):
        idle.add_column(col, justify="left" if col in ("pool", "model", "ownership") else "right")
    for line in lines:
        idle.add_row(escape(line["pool"]), line["model"], line["ownership"], str(line["gpus"]), f"${line['fleet_usd']}",
                     f"${line['allocated_usd']}", f"${line['idle_usd']}",
                     "-" if line["idle_pct"] is None else f"{line['idle_pct']:.0f}%")
    return idle


def _running_jobs(conn: Connection) -> set[str] | None:
    """Ids of the jobs running now (the scheduler knows), to mark them; None when the scheduler does not answer."""
    try:
        return {j["job_id"] for j in conn.get("scheduler", "/v1/jobs", state="running", limit=1000)}
    except ClientError:
        return None


def group_notes(notes: list[str]) -> list[str]:
    """One line per distinct note: "GPU-…: no owned A100 price book entry …" on 8 GPUs becomes one line with the
    count."""
    import re

    gpu_note = re.compile(r"^(GPU-[0-9A-Fa-f-]+): (.+)$")
    counts: dict[str, list[str]] = {}
    for note in notes:
        m = gpu_note.match(note)
        what, who = (m.group(2), m.group(1)) if m else (note, "")
        counts.setdefault(what, []).append(who)
    out = []
    for what, who in counts.items():
        gpus = [w for w in who if w]
        if gpus:
            shown = ", ".join(g[:12] + "…" for g in gpus[:3])
            out.append(f"{what} ({len(gpus)} GPU{'s' if len(gpus) > 1 else ''}: {shown}"
                       + (f" and {len(gpus) - 3} more" if len(gpus) > 3 else "") + ")")
        else:
            out.append(what + (f" ({len(who)} times)" if len(who) > 1 else ""))
    return out

@costs_app.command("tco")
def costs_tco(
    model: Annotated[str, typer.Option(help="GPU model, e.g. H100")],
    gpus: Annotated[int, typer.Option(min=1)] = 8,
    utilization: Annotated[float, typer.Option(min=0, max=1, help="expected share of the time in use, 0-1")] = 0.6,
    months: Annotated[int, typer.Option(min=1, max=120)] = 36,
    purchase_price: Annotated[str | None, typer.Option(help="USD per GPU; default: price book")] = None,
    usd_per_kwh: Annotated[str | None, typer.Option(help="default: price book")] = None,
    overhead: Annotated[str | None, typer.Option(help="USD per GPU-month; default: price book")] = None,
    lease_monthly: Annotated[str | None, typer.Option(help="USD per GPU-month; default: price book")] = None,
    cloud_hourly: Annotated[str | None, typer.Option(help="USD per GPU-hour; default: price book")] = None,
) -> None:
    """Owning vs leasing vs renting in a cloud for a workload, with the break-even month."""
    model = gpu_model("--model", model)
    for flag, value in (("--purchase-price", purchase_price), ("--usd-per-kwh", usd_per_kwh),
                        ("--overhead", overhead), ("--lease-monthly", lease_monthly), ("--cloud-hourly", cloud_hourly)):
        amount(flag, value)
    try:
        r = Connection.discover().get(
            "billing", "/v1/tco", model=model, gpus=gpus, utilization=utilization, months=months,
            purchase_price=purchase_price, usd_per_kwh=usd_per_kwh, overhead=overhead,
            lease_monthly=lease_monthly, cloud_hourly=cloud_hourly,
        )
    except ClientError as exc:
        _fail(str(exc))
    table = Table("month", "own (cumulative)", "lease (cumulative)", "cloud (cumulative)",
                  title=f"TCO: {gpus}x {model} at {utilization:.0%} for {months} months")
    rows = r["months"]
    shown = [m for m in rows if m["month"] in (1, 3, 6) or m["month"] % 12 == 0 or m["month"] == len(rows)
             or m["month"] in (r["break_even_vs_cloud"], r["break_even_vs_lease"])]
    for m in shown:
        table.add_row(str(m["month"]), f"${m['own_usd']}", "-" if m["lease_usd"] is None else f"${m['lease_usd']}",
                      f"${m['cloud_usd']}")
    console.print(table)
    be_cloud = r["break_even_vs_cloud"]
    be_lease = r["break_even_vs_lease"]
    console.print(f"owning breaks even with cloud in month {be_cloud}" if be_cloud else
                  f"owning does not break even with cloud within {months} months")
    console.print(f"owning breaks even with leasing in month {be_lease}" if be_lease else
                  "owning does not break even with leasing" + ("" if rows[-1]["lease_usd"] else " (no lease price)"))
    console.print(f"cheapest over {months} months: {r['cheapest']}; residual value of owned GPUs: ${r['residual_usd']}")
    for a in r["assumptions"]:
        console.print(f"- {escape(a)}")
    for k, v in r["sources"].items():
        console.print(f"- {k} prices: {escape(v)}")
