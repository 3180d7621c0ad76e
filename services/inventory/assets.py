"""Declared assets: the YAML file (or admin upload) saying what is owned, leased or rented, and where. No I/O.

```yaml
contracts:
  - id: CW-H200-2026            # letters, digits, '.', '_', '-'
    provider: coreweave
    start: 2026-01-01
    end: 2026-06-30             # last day covered; the lease ends at the end of this day (UTC)
    monthly_price_per_gpu: "2150.00"
    minimum_term_months: 1      # default 1; an auto-renewing lease rolls forward by this much
    auto_renew: false
    notice_days: 30             # notice must be given this many days before the end
assets:
  - node: h200-01               # a whole node, or `gpu: GPU-…` for one GPU (a GPU entry wins)
    model: H200                 # optional; checked against the GPU catalogue and what registers
    gpus: 8                     # optional; expected GPU count
    ownership: leased           # owned | leased | cloud
    site: dc-east
    cluster: cloud-a
    rack: r1
    pool: cloud
    leases: [CW-H200-2026]      # successive contracts; they must not overlap
  - node: a100-01
    ownership: owned
    pool: onprem
    purchase: {price_per_gpu: "17000", date: 2024-06-01, depreciation_months: 36}
  - node: h200-cloud-01
    ownership: cloud
    hourly_price_per_gpu: "4.00"
    since: 2026-11-01           # cloud (and owned without a purchase): the day it joined; billing charges from it
```

Errors are reported as `FILE:LINE: key: problem`, all of them at once (the service reads the file).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from whaleflux.shared import yamlconfig
from whaleflux.shared.catalog import gpu_models, model_key
from whaleflux.shared.yamlconfig import ConfigFileError, KeyPath

Ownership = Literal["owned", "leased", "cloud"]
Ident = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
HOURS_PER_MONTH = Decimal("730")


def day_start(d: date) -> datetime:
    """Midnight UTC at the start of `d`."""
    return datetime.combine(d, time(0), tzinfo=UTC)


class Purchase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    price_per_gpu: Decimal = Field(ge=0)
    date: date
    depreciation_months: int = Field(36, ge=1, le=240)

    def monthly_cost(self, now: datetime) -> Decimal:
        """Straight-line depreciation per GPU per month; nothing once fully depreciated."""
        if now >= day_start(add_months(self.date, self.depreciation_months)):
            return Decimal(0)
        return (self.price_per_gpu / self.depreciation_months).quantize(Decimal("0.01"))


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Ident
    provider: str = Field(min_length=1, max_length=128)
    start: date
    end: date
    monthly_price_per_gpu: Decimal = Field(ge=0)
    minimum_term_months: int = Field(1, ge=1, le=120)
    auto_renew: bool = False
    notice_days: int = Field(0, ge=0, le=3650)

    @field_validator("end")
    @classmethod
    def _end_after_start(cls, end: date, info: ValidationInfo) -> date:
        start = info.data.get("start")
        if start is not None and end < start:
            raise ValueError(f"end {end} is before start {start}")
        return end

    @property
    def starts_at(self) -> datetime:
        return day_start(self.start)

    @property
    def ends_at(self) -> datetime:
        """The end of the last day covered."""
        return day_start(self.end) + timedelta(days=1)


class Asset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str | None = Field(None, min_length=1, max_length=128)
    gpu: str | None = Field(None, min_length=1, max_length=96)
    model: str | None = None
    gpus: int | None = Field(None, ge=1, le=1024)
    ownership: Ownership
    site: str | None = None
    cluster: str | None = None
    rack: str | None = None
    pool: str | None = None
    leases: list[str] = Field(default_factory=list)
    purchase: Purchase | None = None
    hourly_price_per_gpu: Decimal | None = Field(None, ge=0, description="cloud: on-demand or reserved rate")
    since: date | None = Field(None, description="cloud: the day the rental began (billing charges from it)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        if value is None:
            return None
        key = model_key(value)
        if key is None:
            raise ValueError(f"unknown model {value!r} (known: {', '.join(sorted(gpu_models()))})")
        return key

    @model_validator(mode="after")
    def _shape(self) -> Asset:
        if (self.node is None) == (self.gpu is None):
            raise ValueError("give exactly one of `node` or `gpu`")
        return self

    @property
    def label(self) -> str:
        return f"node {self.node}" if self.node else f"gpu {self.gpu}"


class Declarations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    contracts: list[Contract] = Field(default_factory=list)
    assets: list[Asset] = Field(default_factory=list)

    def contract(self, contract_id: str) -> Contract | None:
        return next((c for c in self.contracts if c.id == contract_id), None)


class AssetsError(ConfigFileError):
    """The declarations were rejected; `errors` are `FILE:LINE: key: problem` lines."""


def add_months(d: date, months: int) -> date:
    """`d` plus whole months, clamped to the last day of a shorter month."""
    y, m = divmod(d.month - 1 + months, 12)
    year, month = d.year + y, m + 1
    for day in (d.day, 30, 29, 28):
        try:
            return date(year, month, day)
        except ValueError:
            continue
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- loading


def parse_declarations(text: str, filename: str = "assets.yaml") -> Declarations:
    """Parse and check declarations; raise AssetsError listing every problem with file, line and key."""
    located = yamlconfig.parse(text, filename, AssetsError, "a mapping with `contracts` and `assets`")
    decl = yamlconfig.validate(located, Declarations, AssetsError)
    problems = cross_check(decl)
    if problems:
        raise AssetsError(located.problems(problems))
    return decl


def cross_check(decl: Declarations) -> list[tuple[KeyPath, str]]:
    """Checks across entries: references, duplicates, overlapping leases, ownership consistency."""
    problems: list[tuple[KeyPath, str]] = []
    seen_contracts: set[str] = set()
    for i, c in enumerate(decl.contracts):
        if c.id in seen_contracts:
            problems.append((("contracts", i, "id"), f"contract {c.id!r} is declared twice"))
        seen_contracts.add(c.id)
    seen_assets: dict[str, int] = {}
    for i, a in enumerate(decl.assets):
        key = a.label
        if key in seen_assets:
            field = "node" if a.node else "gpu"
            problems.append((("assets", i, field), f"{key} is already declared at assets[{seen_assets[key]}]"))
        seen_assets.setdefault(key, i)
        if a.ownership == "leased" and not a.leases:
            problems.append((("assets", i, "leases"), "a leased asset needs at least one contract in `leases`"))
        if a.ownership != "leased" and a.leases:
            problems.append((("assets", i, "leases"), f"only leased assets have leases (ownership is {a.ownership})"))
        if a.ownership == "leased" and a.since is not None:
            problems.append((("assets", i, "since"), "a leased asset starts with its contract (`leases`), not `since`"))
        if a.ownership != "owned" and a.purchase is not None:
            problems.append(
                (("assets", i, "purchase"), f"only owned assets have a purchase (ownership is {a.ownership})"))
        contracts: list[tuple[int, Contract]] = []
        for j, ref in enumerate(a.leases):
            found = decl.contract(ref)
            if found is None:
                problems.append((("assets", i, "leases", j), f"unknown contract {ref!r}"))
            else:
                contracts.append((j, found))
        contracts.sort(key=lambda jc: jc[1].start)
        for (_, prev), (j, nxt) in zip(contracts, contracts[1:], strict=False):
            if nxt.starts_at < prev.ends_at:
                problems.append(
                    (("assets", i, "leases", j),
                     f"contract {nxt.id} ({nxt.start}..{nxt.end}) overlaps {prev.id} ({prev.start}..{prev.end})"
                     f" for {key}")
                )
    return problems

