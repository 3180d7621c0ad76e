"""Billing's HTTP responses that other services read: `GET /v1/pricebook` (inventory values owned GPUs with it).

Money is a decimal string on the wire (`Money`, as in inventory.py).
"""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict

from .inventory import Money


class PriceRow(BaseModel):
    """One price entry of `GET /v1/pricebook` (the fields a reader needs; others are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    model: str
    ownership: str
    effective_from: date
    effective_until: date | None = None  # the last day in force
    usd_per_kwh: Money | None = None
    overhead_per_gpu_month: Money | None = None

    def in_force(self, day: date) -> bool:
        return self.effective_from <= day and (self.effective_until is None or day <= self.effective_until)


class PriceBookView(BaseModel):
    """`GET /v1/pricebook`: the operator's entries, then the reference values."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    source: str | None = None
    entries: list[PriceRow] = []
    reference: list[PriceRow] = []
