"""Pure pricing and metering: GPU-seconds and money, no I/O.

Rounding rule: GPU-seconds are kept to the millisecond; the cost of one usage
interval is GPU-seconds x hourly rate / 3600, kept to 1e-6 USD (ROUND_HALF_EVEN);
reports add those exact figures and round the total to cents (ROUND_HALF_UP)
only when shown. Money is Decimal, never float.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

MS = Decimal("0.001")
MICRO = Decimal("0.000001")
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Rate:
    usd_per_gpu_hour: Decimal
    source: str
    as_of: str


# Reference on-demand cloud prices per GPU-hour (shared/data/prices-reference.csv).
# Reference values only: a deployment sets its own price book.
REFERENCE_RATES: dict[str, Rate] = {
    "H100": Rate(Decimal("6.88"), "AWS p5.48xlarge on-demand, us-east-1", "2026-11-09"),
    "H200": Rate(Decimal("7.912"), "AWS p5en.48xlarge on-demand", "2026-08-06"),
    "A100": Rate(Decimal("3.4309"), "AWS p4de.24xlarge on-demand, us-east-1", "2026-11-09"),
    "RTX4090": Rate(Decimal("0.29"), "OpenRelay on-demand (weak anchor)", "2026-09-20"),
}


def gpu_seconds(started_at: datetime, ended_at: datetime, gpus: int) -> Decimal:
    """GPU-seconds held between two instants, to the millisecond; never negative."""
    seconds = Decimal(str(max((ended_at - started_at).total_seconds(), 0.0)))
    return (seconds * gpus).quantize(MS, rounding=ROUND_HALF_EVEN)


def cost(gpu_secs: Decimal, rate: Rate) -> Decimal:
    return (gpu_secs * rate.usd_per_gpu_hour / Decimal(3600)).quantize(MICRO, rounding=ROUND_HALF_EVEN)


def to_cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)
