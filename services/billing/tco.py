"""Total cost of ownership: owning vs leasing vs renting in a cloud for one workload. Pure, no I/O.

Per month, for `gpus` GPUs used `utilization` of the time (730 h per month):
- own: the purchase price per GPU paid in month 1, then power and overhead
  every month; power = (idle W + utilization x (TDP - idle W)) x 730 h x $/kWh,
  from gpu_models.yaml; after `months` the GPUs still hold their
  undepreciated value (straight line), reported as `residual_usd`, not netted;
- lease: the monthly price per GPU, every month, whatever the use (at least
  the minimum term);
- cloud: the hourly on-demand price for the hours used only.
The break-even month is the first month whose cumulative owning cost is at or
below the cumulative cost of the alternative, staying there to the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from whaleflux.shared.catalog import gpu_models, model_key

from .pricebook import PriceBook, PriceEntry
from .pricing import to_cents

HOURS_PER_MONTH = Decimal(730)


@dataclass(frozen=True)
class TcoInput:
    model: str
    gpus: int
    utilization: Decimal  # 0..1
    months: int
    purchase_price_per_gpu: Decimal
    depreciation_months: int
    usd_per_kwh: Decimal
    overhead_per_gpu_month: Decimal
    lease_monthly_per_gpu: Decimal | None
    lease_minimum_months: int
    cloud_hourly_per_gpu: Decimal
    tdp_w: Decimal
    idle_w: Decimal


@dataclass(frozen=True)
class TcoMonth:
    month: int
    own_usd: Decimal
    lease_usd: Decimal | None
    cloud_usd: Decimal


@dataclass(frozen=True)
class TcoResult:
    months: list[TcoMonth]  # cumulative
    break_even_vs_cloud: int | None
    break_even_vs_lease: int | None
    cheapest: str
    residual_usd: Decimal
    power_kwh_per_gpu_month: Decimal
    assumptions: list[str]


def _break_even(own: list[Decimal], other: list[Decimal | None]) -> int | None:
    """First month from which owning stays at or below the alternative, cumulatively."""
    month = None
    for i, (a, b) in enumerate(zip(own, other, strict=True), start=1):
        if b is None:
            return None
        if a <= b:
            month = month or i
        else:
            month = None
    return month


def tco(x: TcoInput) -> TcoResult:
    """Cumulative cost per month of owning, leasing and renting, and the break-even months."""
    if not 0 <= x.utilization <= 1:
        raise ValueError("utilization: must be between 0 and 1")
    if x.gpus < 1 or x.months < 1:
        raise ValueError("gpus and months: must be at least 1")
    watts = x.idle_w + x.utilization * (x.tdp_w - x.idle_w)
    kwh = watts * HOURS_PER_MONTH / 1000
    own_monthly = (kwh * x.usd_per_kwh + x.overhead_per_gpu_month) * x.gpus
    cloud_monthly = x.cloud_hourly_per_gpu * HOURS_PER_MONTH * x.utilization * x.gpus
    lease_monthly = None if x.lease_monthly_per_gpu is None else x.lease_monthly_per_gpu * x.gpus
    rows: list[TcoMonth] = []
    own = x.purchase_price_per_gpu * x.gpus
    lease = Decimal(0)
    cloud = Decimal(0)
    for m in range(1, x.months + 1):
        own += own_monthly
        cloud += cloud_monthly
        if lease_monthly is not None:
            lease += lease_monthly
        rows.append(TcoMonth(m, to_cents(own), None if lease_monthly is None else to_cents(lease), to_cents(cloud)))
    if lease_monthly is not None and x.months < x.lease_minimum_months:
        last = rows[-1]
        rows[-1] = TcoMonth(last.month, last.own_usd, to_cents(lease_monthly * x.lease_minimum_months), last.cloud_usd)
    left = max(x.depreciation_months - x.months, 0)
    residual = to_cents(x.purchase_price_per_gpu * x.gpus * left / x.depreciation_months)
    final = {"own": rows[-1].own_usd, "cloud": rows[-1].cloud_usd}
    if rows[-1].lease_usd is not None:
        final["lease"] = rows[-1].lease_usd
    assumptions = [
        f"{x.gpus}x {x.model} at {x.utilization * 100:.0f}% utilization for {x.months} months of 730 h",
        f"own: ${x.purchase_price_per_gpu:,} per GPU up front, power {watts:.0f} W average at ${x.usd_per_kwh}/kWh "
        f"({kwh:.1f} kWh per GPU-month), overhead ${x.overhead_per_gpu_month}/GPU-month; residual value not netted",
        f"cloud: ${x.cloud_hourly_per_gpu}/GPU-hour for the hours used",
    ]
    if lease_monthly is not None:
        assumptions.append(f"lease: ${x.lease_monthly_per_gpu}/GPU-month, every month whatever the use "
                           f"(minimum {x.lease_minimum_months} months)")
    return TcoResult(
        months=rows,
        break_even_vs_cloud=_break_even([r.own_usd for r in rows], [r.cloud_usd for r in rows]),
        break_even_vs_lease=_break_even([r.own_usd for r in rows], [r.lease_usd for r in rows]),
        cheapest=min(final, key=lambda k: (final[k], k)),
        residual_usd=residual,
        power_kwh_per_gpu_month=kwh.quantize(Decimal("0.1")),
        assumptions=assumptions,
    )


class TcoQueryError(Exception):
    """A TCO question the price book cannot complete (unknown model, a price it has none for); says which."""


@dataclass(frozen=True)
class TcoQuery:
    """A TCO question as asked: prices left None come from the price book in force."""

    model: str
    gpus: int = 8
    utilization: Decimal = Decimal("0.6")
    months: int = 36
    purchase_price: Decimal | None = None
    depreciation_months: int | None = None
    usd_per_kwh: Decimal | None = None
    overhead: Decimal | None = None
    lease_monthly: Decimal | None = None
    cloud_hourly: Decimal | None = None


def _pick(given: Decimal | None, entry: PriceEntry | None, attr: str) -> Decimal | None:
    if given is not None:
        return given
    value: Decimal | None = getattr(entry, attr) if entry is not None else None
    return value


def tco_input(q: TcoQuery, book: PriceBook, now: datetime) -> tuple[TcoInput, dict[str, str]]:
    """The TCO input for `q` with the book's prices filled in, and where each kind of price came from."""
    key = model_key(q.model)
    if key is None:
        raise TcoQueryError(f"model: unknown GPU model {q.model!r} (known: {', '.join(sorted(gpu_models()))})")
    owned, leased, cloud = (book.lookup(key, o, now) for o in ("owned", "leased", "cloud"))
    purchase = _pick(q.purchase_price, owned, "purchase_price_per_gpu")
    kwh = _pick(q.usd_per_kwh, owned, "usd_per_kwh")
    overhead = _pick(q.overhead, owned, "overhead_per_gpu_month")
    hourly = _pick(q.cloud_hourly, cloud, "usd_per_gpu_hour")
    missing = [n for n, v in (("purchase_price", purchase), ("usd_per_kwh", kwh), ("overhead", overhead),
                              ("cloud_hourly", hourly)) if v is None]
    if missing or purchase is None or kwh is None or overhead is None or hourly is None:
        raise TcoQueryError(f"{', '.join(missing)}: no owned/cloud {key} entry in the price book; pass it")
    spec = gpu_models()[key]
    x = TcoInput(
        model=key, gpus=q.gpus, utilization=q.utilization, months=q.months, purchase_price_per_gpu=purchase,
        depreciation_months=q.depreciation_months or (owned.depreciation_months if owned else 36),
        usd_per_kwh=kwh, overhead_per_gpu_month=overhead,
        lease_monthly_per_gpu=_pick(q.lease_monthly, leased, "monthly_price_per_gpu"),
        lease_minimum_months=leased.minimum_term_months if leased else 1, cloud_hourly_per_gpu=hourly,
        tdp_w=Decimal(str(spec.tdp_w)), idle_w=Decimal(str(spec.idle_power_w)),
    )
    sources = {o: (e.source + (f" (reference, {e.as_of})" if e.reference else "")) for o, e in
               (("owned", owned), ("leased", leased), ("cloud", cloud)) if e is not None}
    return x, sources
