"""Billing's pure core: price book, cost timelines, chargeback with idle, budgets, FOCUS rows, TCO. No I/O."""

from __future__ import annotations

import csv
import io
import json
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from whaleflux.billing.allocation import EnergyUse, Interval, IntervalTable, JobInfo, chargeback, showback
from whaleflux.billing.budgets import Budget, evaluate
from whaleflux.billing.exports import FOCUS_COLUMNS, focus_csv, focus_rows
from whaleflux.billing.ownership import GpuTerms, gpu_cost, to_ms
from whaleflux.billing.pricebook import PriceBook, PriceBookError, PriceEntry, parse_pricebook, reference_book
from whaleflux.billing.pricing import REFERENCE_RATES
from whaleflux.billing.tco import TcoInput, tco

UTC = UTC
MAR = datetime(2026, 3, 1, tzinfo=UTC)
APR = datetime(2026, 4, 1, tzinfo=UTC)

BOOK = """\
prices:
  - model: H100
    ownership: owned
    effective_from: 2026-01-01
    effective_until: 2026-03-14
    usd_per_kwh: "0.10"
    overhead_per_gpu_month: "100"
  - model: H100
    ownership: owned
    effective_from: 2026-03-15
    usd_per_kwh: "0.20"
    overhead_per_gpu_month: "200"
    purchase_price_per_gpu: "31000"
  - {model: A100, ownership: cloud, effective_from: 2026-01-01, usd_per_gpu_hour: "2.00"}
"""


# --------------------------------------------------------------------------- price book


def _entry(book: PriceBook, model: str, ownership: str, at: datetime) -> PriceEntry:
    entry = book.lookup(model, ownership, at)
    assert entry is not None, (model, ownership, at)
    return entry


def test_price_book_is_effective_dated_and_falls_back_to_dated_reference_values():
    book = parse_pricebook(BOOK, "book.yaml")
    assert _entry(book, "H100", "owned", datetime(2026, 3, 14, 23, tzinfo=UTC)).usd_per_kwh == Decimal("0.10")
    assert _entry(book, "H100", "owned", datetime(2026, 3, 15, tzinfo=UTC)).usd_per_kwh == Decimal("0.20")
    assert _entry(book, "A100", "cloud", MAR).usd_per_gpu_hour == Decimal("2.00")
    ref = _entry(book, "H100", "cloud", MAR)
    assert ref.reference and ref.as_of == "2026-11-09" and ref.usd_per_gpu_hour == Decimal("6.88")
    assert _entry(book, "H200", "leased", MAR).monthly_price_per_gpu == Decimal("2190")
    # The shipped reference values are the old reference rates, with their dates.
    for model, rate in REFERENCE_RATES.items():
        entry = _entry(reference_book(), model, "cloud", MAR)
        assert entry.usd_per_gpu_hour == rate.usd_per_gpu_hour and entry.as_of == rate.as_of


@pytest.mark.parametrize("text, expected", [
    ("prices:\n  - {model: A100, ownership: cloud, usd_per_gpu_hour: \"-1\"}\n",
     "bad.yaml:2: prices[0].usd_per_gpu_hour: Input should be greater than or equal to 0"),
    ("prices:\n  - model: A100\n    ownership: leased\n",
     "bad.yaml:2: prices[0]: missing monthly_price_per_gpu (required for ownership leased)"),
    ("prices:\n  - {model: A100, ownership: cloud, usd_per_gpu_hour: 1, effective_from: 2026-01-01}\n"
     "  - {model: A100, ownership: cloud, usd_per_gpu_hour: 2,\n     effective_from: 2026-02-01}\n",
     "bad.yaml:4: prices[1].effective_from: A100 cloud 2026-02-01..open end overlaps prices[0]"),
    ("prices:\n  - {model: B200, ownership: cloud, usd_per_gpu_hour: 1}\n",
     "bad.yaml:2: prices[0].model: unknown model 'B200'"),
    ("prices: [\n", "bad.yaml:2: (yaml)"),
])
def test_bad_price_book_names_file_line_and_key(text, expected):
    with pytest.raises(PriceBookError) as exc:
        parse_pricebook(text, "bad.yaml")
    assert any(e.startswith(expected) for e in exc.value.errors), exc.value.errors


# --------------------------------------------------------------------------- cost timelines


def _leased(uuid="L0", pool="cloud", **kw):
    return GpuTerms(uuid=uuid, model="H200", ownership="leased", pool=pool, lease_monthly=Decimal("2150.00"),
                    lease_start=date(2026, 1, 1), lease_end=date(2026, 12, 31), lease_provider="coreweave", **kw)


def _owned(uuid="O0", pool="onprem"):
    return GpuTerms(uuid=uuid, model="H100", ownership="owned", pool=pool, purchase_price=Decimal("30000"),
                    purchase_date=date(2025, 3, 1), depreciation_months=48)


def _fleet_cost(gc, start, end):
    return sum((Decimal(min(s.end_ms, to_ms(end)) - max(s.start_ms, to_ms(start))) * s.usd_per_ms
                for s in gc.segments if min(s.end_ms, to_ms(end)) > max(s.start_ms, to_ms(start))), Decimal(0))


def test_a_whole_calendar_month_costs_exactly_the_monthly_amounts():
    book = parse_pricebook(BOOK)
    lease = gpu_cost(_leased(), book, MAR, APR)
    assert _fleet_cost(lease, MAR, APR).quantize(Decimal("0.000001")) == Decimal("2150.000000")
    owned = gpu_cost(_owned(), book, MAR, APR)
    # 30000/48 amortization + overhead 100 for 14 of 31 days, 200 for 17 of 31.
    expected = Decimal(625) + Decimal(100) * 14 / 31 + Decimal(200) * 17 / 31
    assert _fleet_cost(owned, MAR, APR).quantize(Decimal("0.000001")) == expected.quantize(Decimal("0.000001"))


def test_a_lease_shorter_than_its_minimum_term_owes_the_whole_term():
    short = GpuTerms(uuid="S", model="H200", ownership="leased", lease_monthly=Decimal("3100"),
                     lease_start=date(2026, 3, 10), lease_end=date(2026, 3, 12), minimum_term_months=1)
    gc = gpu_cost(short, reference_book(), datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC))
    assert gc.segments[0].start_ms == to_ms(datetime(2026, 3, 10, tzinfo=UTC))
    assert gc.segments[-1].end_ms == to_ms(datetime(2026, 4, 10, tzinfo=UTC))
    total = _fleet_cost(gc, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC))
    expected = Decimal(3100) * 22 / 31 + Decimal(3100) * 9 / 30
    assert total.quantize(Decimal("0.01")) == expected.quantize(Decimal("0.01"))


def test_owned_gpu_stops_amortizing_when_fully_depreciated():
    old = GpuTerms(uuid="X", model="H100", ownership="owned", purchase_price=Decimal("12000"),
                   purchase_date=date(2023, 3, 1), depreciation_months=36)
    book = parse_pricebook(BOOK)
    feb = gpu_cost(old, book, datetime(2026, 2, 1, tzinfo=UTC), MAR)
    mar = gpu_cost(old, book, MAR, APR)
    assert _fleet_cost(feb, datetime(2026, 2, 1, tzinfo=UTC), MAR).quantize(Decimal("0.01")) == Decimal("433.33")
    assert {p[0] for s in mar.segments for p in s.components} == {"overhead"}


# --------------------------------------------------------------------------- chargeback


def test_job_cost_is_its_gpu_time_at_each_gpus_rate():
    book = parse_pricebook(BOOK)
    a100 = GpuTerms(uuid="A", model="A100", ownership="cloud", pool="c", cloud_hourly=None,
                    in_fleet_since=MAR)
    gpus = {"A": gpu_cost(a100, book, MAR, APR), "B": gpu_cost(
        GpuTerms(uuid="B", model="A100", ownership="cloud", pool="c", in_fleet_since=MAR), book, MAR, APR)}
    t0 = to_ms(datetime(2026, 3, 2, tzinfo=UTC))
    ivs = [Interval("A", t0, t0 + 10 * 3_600_000, "j:1"), Interval("B", t0, t0 + 10 * 3_600_000, "j:1")]
    cb = chargeback(ivs, {"j:1": JobInfo("j", 1, "nlp", "llm", "A100")}, gpus, to_ms(MAR), to_ms(APR))
    assert cb.jobs["j:1"].usd == Decimal("40.000000")  # 2 GPUs x 10 h x $2.00
    assert cb.fleet_usd == Decimal("2976.000000")  # 2 GPUs x 744 h x $2.00
    assert cb.idle_usd == Decimal("2936.000000")


def test_a_cloud_gpu_without_a_declared_start_is_charged_while_allocated_and_said_so():
    book = parse_pricebook(BOOK)
    cloud = GpuTerms(uuid="C", model="A100", ownership="cloud", pool="c", cloud_hourly=Decimal("4"))
    gpus = {"C": gpu_cost(cloud, book, MAR, APR)}
    t0 = to_ms(datetime(2026, 3, 2, tzinfo=UTC))
    cb = chargeback([Interval("C", t0, t0 + 10 * 3_600_000, "j:1")], {"j:1": JobInfo("j", 1, "nlp", "llm", "A100")},
                    gpus, to_ms(MAR), to_ms(APR))
    assert cb.jobs["j:1"].usd == Decimal("40.000000")
    assert cb.fleet_usd == Decimal("40.000000") and cb.idle_usd == 0  # no idle line without a declared start
    assert any("no declared start" in n for n in cb.notes)


def test_time_held_before_a_cloud_gpus_declared_start_is_reported():
    book = parse_pricebook(BOOK)
    since = datetime(2026, 3, 3, tzinfo=UTC)
    cloud = GpuTerms(uuid="C", model="A100", ownership="cloud", pool="c", cloud_hourly=Decimal("4"),
                     in_fleet_since=since)
    gpus = {"C": gpu_cost(cloud, book, MAR, APR)}
    t0 = to_ms(since) - 2 * 3_600_000
    cb = chargeback([Interval("C", t0, t0 + 10 * 3_600_000, "j:1")], {"j:1": JobInfo("j", 1, "nlp", "llm", "A100")},
                    gpus, to_ms(MAR), to_ms(APR))
    assert cb.jobs["j:1"].usd == Decimal("32.000000")  # the 8 h from its declared start
    assert any("job j:1" in n and "2.00 GPU-h outside their declared terms" in n for n in cb.notes)


def test_each_job_and_segment_is_priced_exactly_to_the_micro_dollar_even_at_a_tie():
    """The column path prices GPU-ms sums with floats only where the rounding is certain; ties (a cost of
    exactly n + 0.5 micro-dollars) and near-ties must round half-even as Decimal does."""
    # $0.0018/h = 5e-10 USD/ms: 1,000 ms cost 0.5 micro-dollars (rounds to 0), 3,000 ms 1.5 (rounds to 2).
    # GPU X costs $3,600,000.0018/h: a 3,000 ms job's ~$3,000 is past where floats are exact to the micro-dollar.
    book = parse_pricebook(BOOK)
    hourly = {"C": Decimal("0.0018"), "X": Decimal("3600000.0018")}
    gpus = {u: gpu_cost(GpuTerms(uuid=u, model="A100", ownership="cloud", pool="c", cloud_hourly=h,
                                 in_fleet_since=MAR), book, MAR, APR) for u, h in hourly.items()}
    t0 = to_ms(MAR)
    cases = {"tie-low:1": ("C", 1_000), "tie-high:1": ("C", 3_000), "above:1": ("C", 3_001),
             "huge:1": ("X", 3_000), "huge-long:1": ("X", 400 * 3_600_000 + 1_000)}
    ivs, jobs = [], {}
    for i, (key, (gpu, ms)) in enumerate(cases.items()):
        jobs[key] = JobInfo(key[:-2], 1, "t", "p", "A100")
        ivs.append(Interval(gpu, t0 + i * 2_000_000_000 // 10, t0 + i * 2_000_000_000 // 10 + ms, key))
    cb = chargeback(ivs, jobs, gpus, to_ms(MAR), to_ms(APR))
    for key, (gpu, ms) in cases.items():
        expected = (ms * (hourly[gpu] / 3_600_000)).quantize(Decimal("0.000001"), rounding="ROUND_HALF_EVEN")
        assert cb.jobs[key].fixed_usd == expected, key
    assert cb.jobs["tie-low:1"].fixed_usd == 0 and cb.jobs["tie-high:1"].fixed_usd == Decimal("0.000002")


def test_chargeback_over_columns_equals_one_priced_interval_at_a_time():
    """An independent, one-interval-at-a-time Decimal computation of every job's fixed cost and GPU-ms (each
    job's ms per rate segment summed, then priced), against the column path, over random windows."""
    rng = random.Random(11)
    book = parse_pricebook(BOOK)
    start, end = datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC)
    gpus = _random_fleet(rng, book, start, end)
    ivs, jobs = _random_jobs(rng, gpus, start, end, n=400)
    table = IntervalTable.of(ivs)
    assert table.rows() == ivs
    for _ in range(10):
        a = to_ms(start) + rng.randrange(0, to_ms(end) - to_ms(start))
        b = a + rng.randrange(1, to_ms(end) - a + 1)
        cb = chargeback(table, jobs, gpus, a, b)
        held: dict[tuple[str, int, int, Decimal], int] = {}
        for iv in ivs:
            for seg in gpus[iv.gpu].segments:
                lo, hi = max(iv.start_ms, seg.start_ms, a), min(iv.end_ms, seg.end_ms, b)
                if hi > lo:
                    k = (iv.job, seg.start_ms, seg.end_ms, seg.usd_per_ms)
                    held[k] = held.get(k, 0) + hi - lo
        fixed: dict[str, Decimal] = {}
        for (job, _, _, rate), ms in held.items():
            fixed[job] = fixed.get(job, Decimal(0)) + (ms * rate).quantize(Decimal("0.000001"),
                                                                           rounding="ROUND_HALF_EVEN")
        assert {j: c.fixed_usd for j, c in cb.jobs.items() if c.fixed_usd} == {j: v for j, v in fixed.items() if v}
        clipped = {iv.job: 0 for iv in ivs if min(iv.end_ms, b) > max(iv.start_ms, a)}
        for iv in ivs:
            if iv.job in clipped:
                clipped[iv.job] += max(min(iv.end_ms, b) - max(iv.start_ms, a), 0)
        assert {j: c.gpu_ms for j, c in cb.jobs.items()} == clipped


def _random_fleet(rng: random.Random, book, start, end):
    gpus = {}
    for i in range(6):
        gpus[f"L{i}"] = gpu_cost(_leased(f"L{i}", pool="cloud"), book, start, end)
    for i in range(5):
        gpus[f"O{i}"] = gpu_cost(_owned(f"O{i}"), book, start, end)
    for i in range(3):
        gpus[f"C{i}"] = gpu_cost(GpuTerms(uuid=f"C{i}", model="A100", ownership="cloud", pool="burst",
                                          cloud_hourly=Decimal("3.1"), in_fleet_since=start), book, start, end)
    gpus["U0"] = gpu_cost(GpuTerms(uuid="U0", model="H100", ownership="unknown", pool="?"), book, start, end)
    return gpus


def _random_jobs(rng: random.Random, gpus, start, end, n=300):
    ivs, jobs = [], {}
    lo, hi = to_ms(start), to_ms(end)
    free_at = {g: lo for g in gpus}  # no GPU held twice at once
    for j in range(n):
        g = rng.choice(sorted(gpus))
        s = max(free_at[g], lo) + rng.randrange(0, 40 * 3_600_000)
        e = s + rng.randrange(1, 30 * 3_600_000)
        if e > hi:
            continue
        free_at[g] = e
        key = f"job{j}:1"
        jobs[key] = JobInfo(f"job{j}", 1, rng.choice(["nlp", "cv", "rl"]), rng.choice(["a", "b"]), gpus[g].terms.model,
                            running=rng.random() < 0.1)
        ivs.append(Interval(g, s, e, key))
    return ivs, jobs


def test_reconciliation_jobs_plus_idle_equal_fleet_cost_to_the_cent_for_any_window():
    rng = random.Random(7)
    book = parse_pricebook(BOOK)
    start, end = datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC)
    gpus = _random_fleet(rng, book, start, end)
    ivs, jobs = _random_jobs(rng, gpus, start, end)
    for _ in range(40):
        a = to_ms(start) + rng.randrange(0, to_ms(end) - to_ms(start))
        b = a + rng.randrange(1, to_ms(end) - a + 1)
        w0, w1 = datetime.fromtimestamp(a / 1000, UTC), datetime.fromtimestamp(b / 1000, UTC)
        window_gpus = {u: gpu_cost(g.terms, book, w0, w1) for u, g in gpus.items()}
        energy = [EnergyUse("O0", a - a % 3_600_000 + 3_600_000, 9e6, (("job0:1", 3.3e6),))]
        prices = {("O0", a - a % 3_600_000 + 3_600_000): Decimal("0.2")}
        cb = chargeback(ivs, jobs, window_gpus, a, b, energy, prices)
        # Exactly, and as shown in every grouping, with and without idle shared back.
        assert cb.allocated_usd + cb.idle_usd == cb.fleet_usd
        independent = sum((_fleet_cost(g, w0, w1) for g in window_gpus.values() if not g.usage_only), Decimal(0))
        on_unknown = {iv.job for iv in ivs if iv.gpu == "U0"}
        unknown_use = sum((cb.jobs[j].usd for j in cb.jobs if jobs[j].model == "H100" and j in on_unknown), Decimal(0))
        power = Decimal(9e6) * Decimal("0.2") / 3_600_000 if a < energy[0].start_ms < b else 0
        assert abs(cb.fleet_usd - independent - unknown_use - power) < Decimal("0.0001")
        for by in ("job", "team", "project", "model"):
            for share in (False, True):
                for running in (False, True):
                    sb = showback(cb, by, share, running)
                    _assert_adds_up(sb, cb, by, running)
                    if by == "job" and not running:
                        assert not any(jobs[f"{r.key}:1"].running for r in sb.rows)


def test_idle_is_shared_back_in_proportion_to_use_within_each_pool():
    book = parse_pricebook(BOOK)
    gpus = {f"L{i}": gpu_cost(_leased(f"L{i}"), book, MAR, APR) for i in range(2)}
    t0 = to_ms(MAR)
    ivs = [Interval("L0", t0, t0 + 3 * 3_600_000, "a:1"), Interval("L1", t0, t0 + 1 * 3_600_000, "b:1")]
    jobs = {"a:1": JobInfo("a", 1, "nlp", "p", "H200"), "b:1": JobInfo("b", 1, "cv", "p", "H200")}
    cb = chargeback(ivs, jobs, gpus, to_ms(MAR), to_ms(APR))
    sb = showback(cb, "team", share_idle=True)
    rows = {r.key: r for r in sb.rows}
    assert abs(sb.unshared_idle_usd) <= Decimal("0.01")  # every cent shared, but for rounding
    assert abs(rows["nlp"].idle_share_usd - 3 * rows["cv"].idle_share_usd) <= Decimal("0.03")
    assert abs(rows["nlp"].total_usd + rows["cv"].total_usd - Decimal("4300.00")) <= Decimal("0.01")
    [line] = sb.idle
    assert (line.pool, line.model, line.ownership, line.gpus) == ("cloud", "H200", "leased", 2)


def _assert_adds_up(sb, cb, by, running):
    """Every shown line is its own rounding; every total the sum of the lines it totals (issue 17, 6)."""
    cent = Decimal("0.01")
    exact: dict[str, Decimal] = {}
    for jc in cb.jobs.values():
        if running or not jc.info.running:
            key = {"job": jc.info.job_id, "team": jc.info.team, "project": jc.info.project, "model": jc.info.model}[by]
            exact[key] = exact.get(key, Decimal(0)) + jc.usd
    assert {r.key: r.cost_usd for r in sb.rows} == {k: v.quantize(cent, rounding="ROUND_HALF_UP")
                                                    for k, v in exact.items()}
    assert all(r.total_usd == r.cost_usd + r.idle_share_usd for r in sb.rows)
    assert sb.allocated_usd == sum((r.cost_usd for r in sb.rows), Decimal(0))
    assert sb.idle_usd == sum((line.idle_usd for line in sb.idle), Decimal(0))
    assert sb.fleet_usd == sum((line.fleet_usd for line in sb.idle), Decimal(0))
    assert all(line.fleet_usd == line.allocated_usd + line.idle_usd for line in sb.idle)
    assert sb.unshared_idle_usd == sb.idle_usd - sum((r.idle_share_usd for r in sb.rows), Decimal(0))
    shown = sum((r.total_usd for r in sb.rows), Decimal(0)) + sb.unshared_idle_usd + sb.running_usd + sb.rounding_usd
    assert shown == sb.fleet_usd
    lines = len(sb.rows) + len(sb.idle) + 1
    assert abs(sb.rounding_usd) <= cent / 2 * lines and abs(sb.fleet_usd - cb.fleet_usd) <= cent / 2 * len(sb.idle)


# --------------------------------------------------------------------------- budgets


def test_budget_projection_alerts_once_per_threshold_and_period():
    budget = Budget(scope="team", name="nlp", amount_usd=Decimal("3000"), thresholds_pct=[80, 100])
    daily = {date(2026, 3, d): Decimal("90") for d in range(1, 11)}  # $90/day for 10 days
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    status = evaluate(budget, daily, now)
    # $900 in 9.5 days -> $2,936.84 over March: past 80%, not 100%.
    assert status.spend_to_date == Decimal("900")
    assert [a.event_id for a in status.alerts] == ["raised-cost-budget-team-nlp-202603-80"]
    assert "Team nlp projected to spend $2,936.84 in March 2026" in status.alerts[0].summary
    assert evaluate(budget, daily, now).alerts == status.alerts  # the same ids: published once by the shell
    daily[date(2026, 3, 10)] = Decimal("400")
    assert [a.event_id for a in evaluate(budget, daily, now).alerts][-1] == "raised-cost-budget-team-nlp-202603-100"


def test_a_week_15_percent_over_forecast_alerts():
    budget = Budget(scope="cluster", amount_usd=Decimal("1000000"))
    daily = {}
    start = date(2026, 2, 2)  # a Monday
    for d in range(35):
        daily[start + timedelta(days=d)] = Decimal("100")
    for d in range(28, 35):
        daily[start + timedelta(days=d)] = Decimal("116")  # the last complete week: +16%
    now = datetime(2026, 3, 9, 8, tzinfo=UTC)  # Monday after
    alerts = [a for a in evaluate(budget, daily, now).alerts if a.rule == "SpendAboveForecast"]
    assert [a.event_id for a in alerts] == ["raised-cost-week-cluster-all-20260302"]
    assert alerts[0].summary.startswith("Cluster spend exceeded forecast by 16% in the week of 2026-03-02")
    for d in range(28, 35):
        daily[start + timedelta(days=d)] = Decimal("114")
    assert not [a for a in evaluate(budget, daily, now).alerts if a.rule == "SpendAboveForecast"]


# --------------------------------------------------------------------------- FOCUS


def _focus_spec(dataset: str = "CostAndUsage") -> dict[str, dict]:
    """The FOCUS 1.3 column list of one dataset (tests/data/README.md); a missing file fails the test."""
    with open(Path(__file__).parent / "data" / "focus" / "focus-1.3-columns.csv") as fh:
        return {r["ColumnID"]: r for r in csv.DictReader(fh) if r["Dataset"] == dataset}


def test_focus_export_has_every_mandatory_column_with_its_type_and_rules():
    book = parse_pricebook(BOOK)
    rng = random.Random(11)
    gpus = _random_fleet(rng, book, MAR, APR)
    ivs, jobs = _random_jobs(rng, gpus, MAR, APR, n=60)
    hour = to_ms(MAR) + 5 * 3_600_000
    energy = [EnergyUse("O1", hour, 7.2e6, ((next(iter(jobs)), 3.6e6),))]
    prices = {("O1", hour): Decimal("0.20")}
    rows = focus_rows(ivs, jobs, gpus, to_ms(MAR), to_ms(APR), energy, prices)
    text = focus_csv(rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    spec = _focus_spec()
    mandatory = [c for c, r in spec.items() if r["FeatureLevel"] == "Mandatory"]
    assert set(mandatory) <= set(parsed[0].keys())
    custom = [c for c in parsed[0] if c not in spec]
    assert custom and all(c.startswith("x_") for c in custom)
    for c in ("ResourceId", "ConsumedQuantity", "ConsumedUnit", "PricingQuantity", "PricingUnit", "Tags",
              "x_Team", "x_Project", "x_JobId", "x_GpuUuid"):
        assert c in parsed[0]
    iso = "%Y-%m-%dT%H:%M:%SZ"
    for r in parsed:
        for c in parsed[0]:
            s = spec.get(c)
            if s is None:
                continue
            if s["AllowsNulls"] == "False":
                assert r[c] != "", (c, r)
            if r[c] == "":
                continue
            if s["DataType"] == "Decimal":
                Decimal(r[c])
            elif s["DataType"] == "Date/Time":
                datetime.strptime(r[c], iso)
            elif s["DataType"] == "JSON":
                assert isinstance(json.loads(r[c]), dict)
        assert r["BillingCurrency"] == "USD"
        assert r["ChargeCategory"] in {"Usage", "Purchase"} and r["ChargeClass"] == ""
        assert datetime.strptime(r["ChargePeriodStart"], iso) < datetime.strptime(r["ChargePeriodEnd"], iso)
        assert r["BillingPeriodStart"] <= r["ChargePeriodStart"] and r["ChargePeriodEnd"] <= r["BillingPeriodEnd"]
        assert r["BillingPeriodStart"].endswith("-01T00:00:00Z")
        if r["ChargeCategory"] == "Usage":
            assert r["ChargeFrequency"] == "Usage-Based" and r["ConsumedQuantity"] and r["ConsumedUnit"]
        else:
            assert r["ChargeFrequency"] == "Recurring" and r["ConsumedQuantity"] == "" and r["ConsumedUnit"] == ""
            assert Decimal(r["EffectiveCost"]) == 0 and Decimal(r["BilledCost"]) > 0
        assert r["PricingUnit"] and r["PricingQuantity"]
        assert Decimal(r["BilledCost"]) >= 0 or r["ChargeCategory"] == "Usage"
        assert r["ServiceCategory"] in {"Compute", "AI and Machine Learning"}
        if r["x_JobId"]:
            assert json.loads(r["Tags"]) == {"team": r["x_Team"], "project": r["x_Project"], "job": r["x_JobId"]}
    # Monthly lease fees: one recurring purchase row per leased GPU for March, the full fee.
    purchases = [r for r in parsed if r["ChargeCategory"] == "Purchase"]
    assert sorted(r["ResourceId"] for r in purchases) == [f"L{i}" for i in range(6)]
    assert {r["BilledCost"] for r in purchases} == {"2150.000000"}
    # Effective cost of all rows is the fleet cost of the window.
    cb = chargeback(ivs, jobs, gpus, to_ms(MAR), to_ms(APR), energy, prices)
    effective = sum((Decimal(r["EffectiveCost"]) for r in parsed), Decimal(0))
    assert effective.quantize(Decimal("0.01")) == cb.fleet_usd.quantize(Decimal("0.01"))
    assert set(FOCUS_COLUMNS) == set(parsed[0])


def test_focus_idle_shared_back_is_split_cost_allocation_that_adds_up_to_its_origin():
    """FOCUS 1.3 split cost allocation (AllocatedMethodId, AllocatedMethodDetails, AllocatedResourceId/Name,
    AllocatedTags) for idle shared back to teams: each idle row split by the teams' GPU-hours in its pool, every
    summable column adding up exactly to the idle row it came from, the ratios to 1, the export's total
    unchanged, and each team's share within rounding of the showback's idle share."""
    book = parse_pricebook(BOOK)
    rng = random.Random(5)
    gpus = _random_fleet(rng, book, MAR, APR)
    ivs, jobs = _random_jobs(rng, gpus, MAR, APR, n=80)
    hour = to_ms(MAR) + 5 * 3_600_000
    energy = [EnergyUse("O1", hour, 7.2e6, ((next(iter(jobs)), 3.6e6),))]
    prices = {("O1", hour): Decimal("0.20")}
    plain = focus_rows(ivs, jobs, gpus, to_ms(MAR), to_ms(APR), energy, prices)
    split = focus_rows(ivs, jobs, gpus, to_ms(MAR), to_ms(APR), energy, prices, share_idle_by="team")
    parsed = list(csv.DictReader(io.StringIO(focus_csv(split))))
    spec = _focus_spec()
    allocated_columns = ["AllocatedMethodId", "AllocatedMethodDetails", "AllocatedResourceId",
                         "AllocatedResourceName", "AllocatedTags"]
    for c in allocated_columns:
        assert c in spec and spec[c]["Introduced"] == "1.3" and c in parsed[0]
    plain_parsed = list(csv.DictReader(io.StringIO(focus_csv(plain))))
    assert all(r[c] == "" for r in plain_parsed for c in allocated_columns)  # no split asked: none allocated
    total = lambda rows: sum((Decimal(r["EffectiveCost"]) for r in rows), Decimal(0))  # noqa: E731
    assert total(parsed) == total(plain_parsed)  # exactly, not just to the cent
    origins = [r for r in plain_parsed if r["x_Idle"] == "true" and r["ChargeCategory"] == "Usage"]
    assert origins
    by_origin: dict[tuple, list[dict]] = {}
    for r in parsed:
        if r["AllocatedMethodId"]:
            assert r["AllocatedMethodId"] == "whaleflux-idle-by-gpu-hours" and r["x_Idle"] == "true"
            assert r["AllocatedResourceId"] == f"team/{r['AllocatedResourceName']}"
            assert json.loads(r["AllocatedTags"]) == {"team": r["AllocatedResourceName"]}
            assert "team" not in json.loads(r["Tags"])  # AllocatedTags never repeats Tags
            [element] = json.loads(r["AllocatedMethodDetails"])["Elements"]
            assert element["UsageUnit"] == "GPU-Hours" and 0 <= element["AllocatedRatio"] <= 1
            by_origin.setdefault((r["ResourceId"], r["ChargePeriodStart"], r["PricingUnit"]), []).append(r)
        else:
            assert all(r[c] == "" for c in allocated_columns)
    used_pools = {(r["x_Pool"], r["x_GpuModel"]) for r in plain_parsed
                  if r["x_JobId"] and r["PricingUnit"] == "GPU-Hours"}
    for o in origins:
        parts = by_origin.get((o["ResourceId"], o["ChargePeriodStart"], o["PricingUnit"]))
        if (o["x_Pool"], o["x_GpuModel"]) not in used_pools:
            assert parts is None
            continue
        assert parts, o
        for c in ("EffectiveCost", "BilledCost", "ListCost", "ContractedCost", "ConsumedQuantity", "PricingQuantity"):
            assert sum((Decimal(p[c]) for p in parts), Decimal(0)) == Decimal(o[c]), c
        ratios = [Decimal(str(json.loads(p["AllocatedMethodDetails"])["Elements"][0]["AllocatedRatio"]))
                  for p in parts]
        assert abs(sum(ratios, Decimal(0)) - 1) < Decimal("1e-9")
        assert all(p[c] == o[c] for p in parts for c in ("ContractedUnitPrice", "ListUnitPrice", "SkuId",
                                                         "ResourceName", "RegionId", "ChargePeriodEnd"))
    cb = chargeback(ivs, jobs, gpus, to_ms(MAR), to_ms(APR), energy, prices)
    sb = showback(cb, "team", share_idle=True)
    shares: dict[str, Decimal] = {}
    for r in split:
        if r["AllocatedMethodId"]:
            shares[r["AllocatedResourceName"]] = shares.get(r["AllocatedResourceName"], Decimal(0)) + r["EffectiveCost"]
    for row in sb.rows:
        assert abs(shares.get(row.key, Decimal(0)).quantize(Decimal("0.01")) - row.idle_share_usd) <= Decimal("0.02")


# --------------------------------------------------------------------------- TCO


def test_tco_finds_the_month_owning_becomes_cheaper_than_cloud():
    x = TcoInput(model="H100", gpus=8, utilization=Decimal("0.7"), months=36, purchase_price_per_gpu=Decimal("30000"),
                 depreciation_months=48, usd_per_kwh=Decimal("0.12"), overhead_per_gpu_month=Decimal("150"),
                 lease_monthly_per_gpu=Decimal("2000"), lease_minimum_months=12, cloud_hourly_per_gpu=Decimal("6.88"),
                 tdp_w=Decimal(700), idle_w=Decimal(75))
    r = tco(x)
    # Per GPU-month: cloud 6.88 x 730 x 0.7 = 3515.68; own 150 + 512.5 W x 730 h x 0.12 = 194.90.
    cloud, own = Decimal("3515.68"), Decimal(150) + Decimal("512.5") * 730 / 1000 * Decimal("0.12")
    month = next(m for m in range(1, 37) if 30000 + own * m <= cloud * m)
    assert r.break_even_vs_cloud == month == 10
    assert r.break_even_vs_lease == next(m for m in range(1, 37) if 30000 + own * m <= 2000 * m) == 17
    assert r.cheapest == "own" and r.residual_usd == Decimal("60000.00")
    assert tco(TcoInput(**{**x.__dict__, "utilization": Decimal("0.05")})).break_even_vs_cloud is None
