"""Inventory's HTTP responses that other services read: `/v1/assets` (billing), `/v1/findings`
(alerting's cost guardians), `/v1/leases` (the scheduler's lease ends), and the rest the console shows.

Money is a decimal string on the wire (`"2.50"`, never a float): `Money` parses a string or a number
into a `Decimal` and writes it back as a plain decimal string.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, PlainSerializer, TypeAdapter


def _plain(value: Decimal) -> str:
    return format(value, "f")


Money = Annotated[Decimal, PlainSerializer(_plain, return_type=str, when_used="json")]
Ownership = Literal["owned", "leased", "cloud", "owned-unknown"]  # owned-unknown: seen, never declared
FindingKind = Literal["idle-allocated", "reserved-idle", "consolidation", "capacity", "undeclared", "never-seen",
                      "mismatch", "quarantined"]


class _Response(BaseModel):
    # A consumer tolerates fields added later (a new field is not a breaking change); the producer's
    # response_model writes exactly these.
    model_config = ConfigDict(extra="ignore", frozen=True)


class LeaseTerms(_Response):
    """The lease in force on a GPU (or its latest one)."""

    contract_id: str
    provider: str
    start: date
    end: date  # the last day covered
    monthly_price_per_gpu_usd: Money | None
    minimum_term_months: int
    auto_renew: bool
    notice_days: int


class PurchaseTerms(_Response):
    price_per_gpu_usd: Money | None
    date: date
    depreciation_months: int


class Asset(_Response):
    """One GPU of `GET /v1/assets`: ownership, place and terms (what billing prices it with)."""

    uuid: str
    index: int
    model: str
    node: str
    status: str  # active | missing
    last_seen: datetime
    ownership: Ownership
    declared: bool
    site: str | None
    cluster: str
    rack: str | None
    pool: str
    monthly_cost_usd: Money | None  # what it costs per month used or not; None if unknown
    lease: LeaseTerms | None
    contracts: list[str]
    purchase: PurchaseTerms | None
    hourly_price_per_gpu_usd: Money | None  # cloud
    since: date | None = None  # declared: the day a cloud GPU's rental began (owned without a purchase: in service)


class LeaseRow(_Response):
    """One contract of `GET /v1/leases`."""

    contract_id: str
    provider: str
    state: Literal["pending", "active", "renewed", "expired"]
    start: date
    ends_at: datetime  # the end of the term in force (an auto-renewing lease rolls forward), exclusive
    covered_through: date | None = None  # the term's last day covered, as declared (inclusive)
    days_left: float
    notice_deadline: datetime | None
    notice_by: date | None = None  # the last day to give notice (the deadline is the end of it, UTC)
    notice_days_left: float | None
    auto_renew: bool
    minimum_term_months: int
    renewed_by: str | None
    gpu_count: int
    nodes: list[str]
    gpu_models: list[str]
    monthly_price_per_gpu_usd: Money | None
    monthly_cost_usd: Money | None


class Finding(_Response):
    """One item of `GET /v1/findings`: idle or reserved GPUs, pools to consolidate, capacity, reconciliation."""

    kind: FindingKind
    severity: Literal["info", "warning"]
    summary: str
    monthly_usd: Money | None  # what the GPUs concerned cost per month; None if unknown
    gpus: list[str]
    detail: dict[str, str]


class CapacityRow(_Response):
    """One row of `GET /v1/capacity`: free GPUs and whole free nodes per model and pool."""

    model: str
    pool: str
    gpus: int
    free: int
    free_nodes: int


class Declarations(_Response):
    """`GET /v1/declarations`: the declarations in force, where they came from, the last rejected attempt."""

    source: str | None
    applied_at: str | None
    declarations: dict[str, Any]  # inventory's own declaration model (contracts, assets), as JSON
    last_error: dict[str, Any] | None
    never_seen: list[str]  # declarations no registered GPU matches
    undeclared: list[str]  # GPU uuids registered but not declared
    mismatches: list[str]


# Parsers of whole responses, for the consumers.
ASSETS: TypeAdapter[list[Asset]] = TypeAdapter(list[Asset])
FINDINGS: TypeAdapter[list[Finding]] = TypeAdapter(list[Finding])
LEASES: TypeAdapter[list[LeaseRow]] = TypeAdapter(list[LeaseRow])
