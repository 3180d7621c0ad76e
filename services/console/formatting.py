"""How numbers, times and money read on the pages (Jinja filters)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from whaleflux.shared import money


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """"3 s ago", "5 min ago", "2 h ago", "4 days ago"; "in 3 days" for the future."""
    if value is None:
        return "—"
    now = now or datetime.now(UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = (now - value).total_seconds()
    span = abs(seconds)
    text = (f"{span:.0f} s" if span < 90 else f"{span / 60:.0f} min" if span < 5400
            else f"{span / 3600:.0f} h" if span < 172800 else f"{span / 86400:.0f} days")
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def when(value: datetime | None) -> str:
    """UTC, to the second: what an operator compares with logs."""
    if value is None:
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gib(mib: float | None) -> str:
    return "—" if mib is None else f"{mib / 1024:.1f} GiB"


def num(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{(' ' + unit) if unit else ''}"


def usd(value: str | float | Decimal | None) -> str:
    """Money as the services send it (decimal strings), with thousands separators; never through float."""
    if value is None or value == "":
        return "—"
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    places = 2 if abs(amount) >= 1 or amount == 0 else 6
    return f"${amount:,.{places}f}"


# A job's cost and its GPUs' rate: as the CLI shows them (shared/money.py), not rounded again here.
FILTERS = {"ago": ago, "when": when, "gib": gib, "num": num, "usd": usd, "job_usd": money.job_usd,
           "gpu_hour_rate": money.gpu_hour_rate}
