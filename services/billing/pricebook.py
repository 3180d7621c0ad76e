"""The price book: effective-dated prices per GPU model and ownership. Pure, no I/O beyond reading text given to it.

```yaml
prices:
  - model: H100                 # catalogue model (H100, H200, A100, RTX4090)
    ownership: owned            # owned | leased | cloud
    effective_from: 2026-01-01  # first day in force (00:00 UTC)
    effective_until: 2026-12-31 # optional: last day in force; open-ended when absent
    usd_per_kwh: "0.14"         # owned: power, billed on measured energy
    overhead_per_gpu_month: "120.00"   # owned: space, cooling, staff, support per GPU-month
    purchase_price_per_gpu: "30000"    # owned: used when inventory has no purchase terms
    depreciation_months: 48            # owned: straight line, default 36
    source: "facilities contract 2026"
  - {model: H200, ownership: leased, effective_from: 2026-01-01, monthly_price_per_gpu: "2190.00",
     minimum_term_months: 1}
  - {model: A100, ownership: cloud, effective_from: 2026-01-01, usd_per_gpu_hour: "3.4309"}
```

Problems are reported as `FILE:LINE: key: problem`, all at once; the caller
keeps the previous good book. Entries not given fall back to the reference
values shipped in `shared/data/prices-reference.csv` (cloud on-demand list
prices per model, one term-lease reference), each marked `reference` with its
date: they are what a cloud charges, not what this fleet pays.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from whaleflux.shared import yamlconfig
from whaleflux.shared.catalog import gpu_models, model_key
from whaleflux.shared.datafiles import DATA_DIR
from whaleflux.shared.yamlconfig import ConfigFileError

Ownership = Literal["owned", "leased", "cloud"]
REFERENCE_CSV = DATA_DIR / "prices-reference.csv"
Money = Decimal


def day_start(d: date) -> datetime:
    return datetime.combine(d, time(0), tzinfo=UTC)


class PriceEntry(BaseModel):
    """One price for one GPU model and ownership over a range of days."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str
    ownership: Ownership
    effective_from: date = date(1970, 1, 1)
    effective_until: date | None = None
    # owned
    usd_per_kwh: Money | None = Field(None, ge=0)
    overhead_per_gpu_month: Money | None = Field(None, ge=0)
    purchase_price_per_gpu: Money | None = Field(None, ge=0)
    depreciation_months: int = Field(36, ge=1, le=240)
    # leased
    monthly_price_per_gpu: Money | None = Field(None, ge=0)
    minimum_term_months: int = Field(1, ge=1, le=120)
    # cloud
    usd_per_gpu_hour: Money | None = Field(None, ge=0)
    source: str = ""
    reference: bool = False
    as_of: str | None = None

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        key = model_key(value)
        if key is None:
            raise ValueError(f"unknown model {value!r} (known: {', '.join(sorted(gpu_models()))})")
        return key

    @model_validator(mode="after")
    def _required_for_ownership(self) -> PriceEntry:
        needed = {
            "owned": ("usd_per_kwh", "overhead_per_gpu_month"),
            "leased": ("monthly_price_per_gpu",),
            "cloud": ("usd_per_gpu_hour",),
        }[self.ownership]
        missing = [f for f in needed if getattr(self, f) is None]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (required for ownership {self.ownership})")
        if self.effective_until is not None and self.effective_until < self.effective_from:
            raise ValueError("effective_until is before effective_from")
        return self

    @property
    def starts_at(self) -> datetime:
        return day_start(self.effective_from)

    @property
    def ends_at(self) -> datetime | None:
        """Exclusive end: 00:00 UTC the day after `effective_until`."""
        return None if self.effective_until is None else day_start(self.effective_until + timedelta(days=1))

    def covers(self, at: datetime) -> bool:
        return self.starts_at <= at and (self.ends_at is None or at < self.ends_at)


class PriceBookDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prices: list[PriceEntry] = Field(default_factory=list)


class PriceBookError(ConfigFileError):
    """The price book was rejected; `errors` are `FILE:LINE: key: problem` lines."""


@dataclass(frozen=True)
class PriceBook:
    """Operator entries first, reference entries as the fallback, both effective-dated."""

    entries: tuple[PriceEntry, ...] = ()
    reference: tuple[PriceEntry, ...] = ()
    source: str = "reference"

    def lookup(self, model: str, ownership: str, at: datetime) -> PriceEntry | None:
        """The entry in force for (model, ownership) at `at`: the operator's, else the reference one."""
        for pool in (self.entries, self.reference):
            for e in pool:
                if e.model == model and e.ownership == ownership and e.covers(at):
                    return e
        return None

    def boundaries(self, model: str, ownership: str) -> list[datetime]:
        """Instants where the price in force for (model, ownership) may change."""
        out = set()
        for e in (*self.entries, *self.reference):
            if e.model == model and e.ownership == ownership:
                out.add(e.starts_at)
                if e.ends_at is not None:
                    out.add(e.ends_at)
        return sorted(out)

    def all_entries(self) -> list[PriceEntry]:
        return [*self.entries, *self.reference]


# --------------------------------------------------------------------------- reference values

# Which rows of prices-reference.csv are the reference for each (model, ownership):
# the on-demand price the old REFERENCE_RATES used, and the one true term lease.
_REFERENCE_ROWS: tuple[tuple[str, Ownership, str, str], ...] = (
    ("H100", "cloud", "AWS", "p5.48xlarge on-demand"),
    ("H200", "cloud", "AWS", "p5en.48xlarge on-demand"),
    ("A100", "cloud", "AWS", "p4de.24xlarge on-demand"),
    ("RTX4090", "cloud", "OpenRelay", "on-demand"),
    ("H200", "leased", "Qubrid", "8-GPU bare metal annual"),
)


@lru_cache(maxsize=4)
def reference_entries(path: str = str(REFERENCE_CSV)) -> tuple[PriceEntry, ...]:
    """Reference prices from prices-reference.csv, each marked `reference` with its date and source."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for model, ownership, provider, offer in _REFERENCE_ROWS:
        row = next(r for r in rows if r["provider"] == provider and r["offer"] == offer)
        source = f"{provider} {offer}" + (f", {row['region']}" if row["region"] else "") + " (reference list price)"
        fields: dict[str, Any] = {"model": model, "ownership": ownership, "source": source, "reference": True,
                                  "as_of": row["as_of"]}
        if ownership == "cloud":
            fields["usd_per_gpu_hour"] = Decimal(row["usd_per_gpu_hour"])
        else:
            fields["monthly_price_per_gpu"] = Decimal(row["usd_per_gpu_month_730h"])
        out.append(PriceEntry(**fields))
    return tuple(out)


def reference_book() -> PriceBook:
    return PriceBook(entries=(), reference=reference_entries(), source="reference")


# --------------------------------------------------------------------------- loading


def _money_as_text(doc: Any) -> Any:
    """YAML floats become Decimals through their text, never through binary floats."""
    if isinstance(doc, dict):
        return {k: _money_as_text(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_money_as_text(v) for v in doc]
    if isinstance(doc, float):
        return repr(doc)
    return doc


def parse_pricebook(text: str, filename: str = "pricebook.yaml") -> PriceBook:
    """Parse and check a price book; raise PriceBookError naming file, line and key of every problem."""
    located = yamlconfig.parse(text, filename, PriceBookError, "a mapping with `prices`")
    parsed = yamlconfig.validate(located, PriceBookDoc, PriceBookError, prepare=_money_as_text)
    problems = [
        (("prices", j, "effective_from"), f"{what} overlaps prices[{i}]") for i, j, what in overlaps(parsed.prices)
    ]
    if problems:
        raise PriceBookError(located.problems(problems))
    return PriceBook(entries=tuple(parsed.prices), reference=reference_entries(), source=filename)


def overlaps(entries: list[PriceEntry]) -> list[tuple[int, int, str]]:
    """Pairs (earlier index, later index, description) of entries for one model and ownership whose dates overlap."""
    out = []
    for j, b in enumerate(entries):
        for i, a in enumerate(entries[:j]):
            if (a.model, a.ownership) != (b.model, b.ownership):
                continue
            a_end, b_end = a.ends_at, b.ends_at
            if (a_end is None or b.starts_at < a_end) and (b_end is None or a.starts_at < b_end):
                until = b.effective_until or "open end"
                out.append((i, j, f"{b.model} {b.ownership} {b.effective_from}..{until}"))
    return out


def entry_json(e: PriceEntry) -> dict[str, Any]:
    """A price entry for the API: money as decimal strings, absent fields dropped."""
    out = e.model_dump(mode="json", exclude_none=True)
    for k in list(out):
        if isinstance(getattr(e, k), Decimal):
            out[k] = format(getattr(e, k), "f")
    return out
