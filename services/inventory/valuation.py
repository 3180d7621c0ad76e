"""What an owned GPU costs per month, as billing charges it: amortization + overhead + power. Pure, no I/O.

Inventory knows the purchase (amortization: price / depreciation months, 0
once fully depreciated); billing's price book (`GET /v1/pricebook`, fetched by
the service) knows the overhead per GPU-month and the price of a kWh. A GPU a
finding is about sits idle, so its power is its model's idle draw
(`idle_power_w` in the GPU catalogue) for 730 hours. Without the price book the
amortization stands alone, and findings say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.contracts.billing import PriceBookView, PriceRow

from .reconcile import GpuAsset

HOURS_PER_MONTH = Decimal(730)


def owned_price(view: PriceBookView, model: str, now: datetime) -> PriceRow | None:
    """The owned price entry in force for `model` at `now`: the operator's first, then the reference values."""
    day = now.date()
    for row in (*view.entries, *view.reference):
        if row.model == model and row.ownership == "owned" and row.in_force(day):
            return row
    return None


def idle_power_usd(model: str, usd_per_kwh: Decimal) -> Decimal:
    """A month of the model's idle draw at `usd_per_kwh`."""
    spec = gpu_models().get(model)
    if spec is None:
        return Decimal(0)
    return Decimal(str(spec.idle_power_w)) * HOURS_PER_MONTH / 1000 * usd_per_kwh


def revalue(assets: Sequence[GpuAsset], view: PriceBookView | None, now: datetime) -> list[GpuAsset]:
    """The assets with each owned GPU's monthly cost as billing charges it (when the price book has its model)."""
    if view is None:
        return list(assets)
    out = []
    for a in assets:
        row = owned_price(view, a.model, now) if a.ownership == "owned" else None
        if row is None:
            out.append(a)
            continue
        amortization = a.monthly_cost or Decimal(0)
        overhead = row.overhead_per_gpu_month or Decimal(0)
        power = idle_power_usd(a.model, row.usd_per_kwh) if row.usd_per_kwh is not None else Decimal(0)
        out.append(replace(a, monthly_cost=(amortization + overhead + power).quantize(Decimal("0.01")),
                           valued="billing"))
    return out


def valuation(gpus: Sequence[GpuAsset]) -> str:
    """What a finding's money counts for its owned GPUs, said in the summary (also for fully depreciated ones)."""
    owned = [g for g in gpus if g.ownership == "owned"]
    if not owned:
        return ""
    spent = sum(1 for g in owned if g.depreciated)
    if all(g.valued == "billing" for g in owned):
        note = "owned: amortization + overhead + idle power, as billing prices them"
        tail = f"; {spent} fully depreciated: overhead and power only" if spent else ""
    else:
        note = "owned: amortization only; billing's price book not known to inventory"
        tail = f"; {spent} fully depreciated at $0" if spent else ""
    return f" ({note}{tail})"
