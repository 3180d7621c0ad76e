"""A job's cost as every surface shows it: the CLI, the console and the API's own figures, one string.

Billing keeps each attempt's cost to the micro-dollar (`cost_usd` of `GET /v1/costs/jobs/{id}`). A job of a
few seconds costs a fraction of a cent, so rounding it to cents shows "$0.00": a job's cost is shown at
billing's precision, never rounded again, and the same digits everywhere. A running job's cost is what it
cost so far, and says so. Reports (by team, project, pool) are in cents: that is their own rule (report.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

MICRO = Decimal("0.000001")
NO_PRICE = "no price"


def job_usd(value: str | Decimal | None) -> str:
    """One amount of a job's cost: "$0.001913", "$1,234.500000"; "—" when there is none."""
    if value is None or value == "":
        return "—"
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    return f"${amount.quantize(MICRO):,f}"


def gpu_hour_rate(value: str | Decimal | None) -> str:
    """What a GPU-hour costs: "$0.8403/GPU-h", or "no price" when billing has none for those GPUs."""
    if value is None or value == "":
        return NO_PRICE
    try:
        return f"${Decimal(str(value)):,f}/GPU-h"
    except InvalidOperation:
        return NO_PRICE


def job_cost(attempts: Iterable[Mapping[str, Any]]) -> str:
    """A job's cost from its attempts (billing's lines): their sum at billing's precision, marked "so far
    (running)" while an attempt runs; "not charged" when billing has no attempt of it."""
    lines = list(attempts)
    if not lines:
        return "not charged"
    total = sum((Decimal(str(a.get("cost_usd") or 0)) for a in lines), Decimal(0))
    running = any(a.get("so_far") or not a.get("ended_at") for a in lines)
    return job_usd(total) + (" so far (running)" if running else "")
