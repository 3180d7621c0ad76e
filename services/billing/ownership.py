"""What billing knows about each GPU's ownership, and what holding it costs per millisecond. Pure, no I/O.

Inventory's `GET /v1/assets` JSON becomes `GpuTerms`; the price book fills in
what inventory does not say (power, overhead, default prices). `rate_segments`
turns terms into pieces of time with a constant fixed cost rate:

- owned: purchase price / depreciation months per calendar month (0 once
  fully depreciated) + overhead per GPU-month, from the purchase date on;
- leased: the monthly price per calendar month over the contract's term, the
  term extended to the minimum term: the month is owed whatever the use;
- cloud: the hourly rate from the declared start (`since` in inventory's
  declarations); with no declared start, only while allocated (said so);
- unknown (inventory unreachable, or a GPU it does not list): the price
  book's model default (the reference cloud rate), charged only while
  allocated, so such a GPU has no idle line.

A monthly amount accrues evenly over the milliseconds of its calendar month,
so a whole month costs exactly the monthly amount.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from whaleflux.shared.contracts import Asset

from .pricebook import PriceBook, PriceEntry, day_start

MS_PER_HOUR = 3_600_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FAR = datetime(9999, 1, 1, tzinfo=UTC)


def to_ms(t: datetime) -> int:
    """Epoch milliseconds (exact for the microsecond times events carry, truncated to the ms)."""
    d = t - EPOCH
    return (d.days * 86_400 + d.seconds) * 1000 + d.microseconds // 1000


def from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def month_start(t: datetime) -> datetime:
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def next_month(t: datetime) -> datetime:
    return datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)


def add_months(d: date, months: int) -> date:
    y, m = divmod(d.month - 1 + months, 12)
    for day in (d.day, 30, 29, 28):
        try:
            return date(d.year + y, m + 1, day)
        except ValueError:
            continue
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class GpuTerms:
    """One GPU's ownership and the terms inventory declared for it (money Decimal)."""

    uuid: str
    model: str
    ownership: str  # owned | leased | cloud | unknown
    pool: str = "unknown"
    node: str | None = None
    site: str | None = None
    cluster: str | None = None
    purchase_price: Decimal | None = None
    purchase_date: date | None = None
    depreciation_months: int | None = None
    lease_contract: str | None = None
    lease_provider: str | None = None
    lease_monthly: Decimal | None = None
    lease_start: date | None = None
    lease_end: date | None = None  # last day covered
    minimum_term_months: int = 1
    cloud_hourly: Decimal | None = None
    in_fleet_since: datetime | None = None  # declared start (cloud, and owned without a purchase): `since`


def terms_from_assets(assets: list[Asset]) -> dict[str, GpuTerms]:
    """Inventory's /v1/assets rows -> terms per GPU uuid. `owned-unknown` (undeclared) counts as unknown.

    Every date comes from the declaration, never from when billing saw the GPU, so a rebuild prices alike."""
    out = {}
    for a in assets:
        lease, purchase = a.lease, a.purchase
        out[a.uuid] = GpuTerms(
            uuid=a.uuid, model=a.model, ownership="unknown" if a.ownership == "owned-unknown" else a.ownership,
            pool=a.pool or "unassigned", node=a.node, site=a.site, cluster=a.cluster,
            purchase_price=purchase.price_per_gpu_usd if purchase else None,
            purchase_date=purchase.date if purchase else None,
            depreciation_months=purchase.depreciation_months if purchase else None,
            lease_contract=lease.contract_id if lease else None, lease_provider=lease.provider if lease else None,
            lease_monthly=lease.monthly_price_per_gpu_usd if lease else None,
            lease_start=lease.start if lease else None, lease_end=lease.end if lease else None,
            minimum_term_months=(lease.minimum_term_months if lease else None) or 1,
            cloud_hourly=a.hourly_price_per_gpu_usd,
            in_fleet_since=day_start(a.since) if a.since else None,
        )
    return out


@dataclass(frozen=True)
class Segment:
    """A stretch of time over which a GPU's fixed cost accrues at a constant rate."""

    start_ms: int
    end_ms: int
    usd_per_ms: Decimal
    kind: str  # owned | leased | cloud | unknown
    # For the FOCUS export: what the rate is made of, and the list (reference cloud) rate.
    components: tuple[tuple[str, Decimal], ...] = ()
    list_usd_per_hour: Decimal | None = None
    reference: bool = False


@dataclass
class GpuCost:
    """A GPU's fixed-cost timeline; `usage_only` when it has no fleet cost of its own (unknown terms)."""

    terms: GpuTerms
    segments: list[Segment] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    usage_only: bool = False
    notes: tuple[str, ...] = ()

    def find(self, ms: int) -> int:
        """Index of the segment holding `ms`, or of the first one after it."""
        return max(bisect.bisect_right(self.starts, ms) - 1, 0)


def _month_pieces(start: datetime, end: datetime, cuts: list[datetime]) -> list[tuple[datetime, datetime]]:
    points = {start, end}
    t = next_month(start)
    while t < end:
        points.add(t)
        t = next_month(t)
    points.update(c for c in cuts if start < c < end)
    ordered = sorted(points)
    return list(zip(ordered, ordered[1:], strict=False))


def _ms_in_month(t: datetime) -> int:
    return to_ms(next_month(t)) - to_ms(month_start(t))


def lease_term(start: date, end: date | None, minimum_term_months: int) -> tuple[datetime, datetime]:
    """[start, end) of what a lease owes: its term (`end` the last day covered), extended to the minimum term."""
    last = end or start
    until = max(day_start(last + timedelta(days=1)), day_start(add_months(start, max(minimum_term_months, 1))))
    return day_start(start), until


def _held(terms: GpuTerms) -> tuple[datetime, datetime] | None:
    """[since, until) over which the GPU costs anything at all; None when the declaration gives no start."""
    if terms.ownership == "owned" and terms.purchase_date:
        return day_start(terms.purchase_date), FAR
    if terms.ownership == "leased" and terms.lease_start:
        return lease_term(terms.lease_start, terms.lease_end, terms.minimum_term_months)
    return (terms.in_fleet_since, FAR) if terms.in_fleet_since else None


def _depreciated_at(terms: GpuTerms) -> datetime | None:
    if terms.ownership != "owned" or not terms.purchase_date:
        return None
    return day_start(add_months(terms.purchase_date, terms.depreciation_months or 36))


def _owned_parts(terms: GpuTerms, entry: PriceEntry | None, a: datetime, month_ms: int, dep_end: datetime | None,
                 notes: list[str]) -> list[tuple[str, Decimal]]:
    parts: list[tuple[str, Decimal]] = []
    price = terms.purchase_price if terms.purchase_price is not None else (
        entry.purchase_price_per_gpu if entry else None)
    months = terms.depreciation_months or (entry.depreciation_months if entry else 36)
    if price is None:
        notes.append(f"{terms.uuid}: no purchase price (inventory or price book); amortization 0")
    elif dep_end is None or a < dep_end:
        parts.append(("amortization", price / months / month_ms))
    if entry is None or entry.overhead_per_gpu_month is None:
        notes.append(f"{terms.uuid}: no owned {terms.model} price book entry at {a.date()}; "
                     "overhead and power 0")
    else:
        parts.append(("overhead", entry.overhead_per_gpu_month / month_ms))
    return parts


def _rate_parts(terms: GpuTerms, entry: PriceEntry | None, a: datetime, dep_end: datetime | None,
                notes: list[str]) -> list[tuple[str, Decimal]]:
    """What one piece of time (within one calendar month and price period) costs per ms, by component."""
    month_ms = _ms_in_month(a)
    if terms.ownership == "owned":
        return _owned_parts(terms, entry, a, month_ms, dep_end, notes)
    if terms.ownership == "leased":
        monthly = terms.lease_monthly if terms.lease_monthly is not None else (
            entry.monthly_price_per_gpu if entry else None)
        if monthly is None:
            raise ValueError(f"no lease price for GPU {terms.uuid} ({terms.model})")
        return [("lease", monthly / month_ms)]
    hourly = terms.cloud_hourly if terms.cloud_hourly is not None else (entry.usd_per_gpu_hour if entry else None)
    if hourly is None:
        raise ValueError(f"no cloud price for GPU {terms.uuid} ({terms.model})")
    return [("cloud", hourly / MS_PER_HOUR)]


def _unknown_cost(terms: GpuTerms, list_entry: PriceEntry | None, start: datetime, end: datetime) -> GpuCost:
    """A GPU of unknown ownership: the price book's model default, charged only while allocated."""
    if list_entry is None or list_entry.usd_per_gpu_hour is None:
        raise ValueError(f"no price for GPU model {terms.model}")
    list_rate = list_entry.usd_per_gpu_hour
    rate = list_rate / MS_PER_HOUR
    seg = Segment(to_ms(start), to_ms(end), rate, "unknown", (("usage", rate),), list_rate, list_entry.reference)
    return GpuCost(terms, [seg], [seg.start_ms], usage_only=True,
                   notes=(f"{terms.uuid}: ownership unknown; priced at the price book default for {terms.model}",))


def gpu_cost(terms: GpuTerms, book: PriceBook, start: datetime, end: datetime) -> GpuCost:
    """Fixed-cost segments of one GPU over [start, end); ValueError when the price book lacks a price it needs."""
    list_entry = book.lookup(terms.model, "cloud", start)
    if terms.ownership == "unknown":
        return _unknown_cost(terms, list_entry, start, end)
    list_rate = list_entry.usd_per_gpu_hour if list_entry else None
    own = terms.ownership
    held = _held(terms)
    since, until = held or (start, FAR)
    lo, hi = max(start, since), min(end, until)
    dep_end = _depreciated_at(terms)
    cuts = book.boundaries(terms.model, own) + ([dep_end] if dep_end is not None else [])
    notes: list[str] = []
    segments: list[Segment] = []
    if lo < hi:
        for a, b in _month_pieces(lo, hi, cuts):
            entry = book.lookup(terms.model, own, a)
            parts = _rate_parts(terms, entry, a, dep_end, notes)
            rate = sum((r for _, r in parts), Decimal(0))
            reference = bool(entry and entry.reference) and own != "owned" and (
                (own == "leased" and terms.lease_monthly is None) or (own == "cloud" and terms.cloud_hourly is None))
            segments.append(Segment(to_ms(a), to_ms(b), rate, own, tuple(parts), list_rate, reference))
    if held is None:  # no declared start: what it costs while allocated, never an idle line
        notes.append(f"{terms.uuid}: {own} {terms.model} has no declared start (`since` in inventory's "
                     "declarations); charged only while allocated")
    return GpuCost(terms, segments, [s.start_ms for s in segments], usage_only=held is None,
                   notes=tuple(dict.fromkeys(notes)))


def power_price(terms: GpuTerms, book: PriceBook, at: datetime) -> Decimal | None:
    """USD per kWh for an owned GPU at `at` (leased and cloud prices include power)."""
    if terms.ownership != "owned":
        return None
    entry = book.lookup(terms.model, "owned", at)
    return entry.usd_per_kwh if entry else None
