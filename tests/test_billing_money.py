"""Issue 17's money rules on the pure core: overlaps charged once, reports that add up. No I/O."""

from __future__ import annotations

import json
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from whaleflux.billing import costing
from whaleflux.billing.allocation import Interval
from whaleflux.billing.budgets import Budget, alert_changes, evaluate, week_forecast
from whaleflux.billing.costing import Inputs
from whaleflux.billing.energy import Series
from whaleflux.billing.metering import Overlap, UsageRecord, without_overlaps
from whaleflux.billing.ownership import GpuTerms
from whaleflux.billing.pricebook import parse_pricebook
from whaleflux.billing.report import costs_report
from whaleflux.billing.usage import UsageColumns
from whaleflux.shared.events import AlertRaised, AlertResolved

MAR = datetime(2026, 3, 1, tzinfo=UTC)
APR = datetime(2026, 4, 1, tzinfo=UTC)
BOOK = parse_pricebook("prices: []\n")
BOOK_LEASE = BOOK
H = 3_600_000


def _record(job: str, gpu: str, start: datetime, hours: float, team: str = "nlp") -> UsageRecord:
    return UsageRecord(job_id=job, attempt=1, team=team, project="p", gpu_model="H200", gpus=1, node="n",
                       gpu_uuids=[gpu], started_at=start, ended_at=start + timedelta(hours=hours))


def test_overlapping_intervals_of_one_gpu_keep_the_time_once_and_are_reported():
    ivs = [Interval("G", 0, 10 * H, "a:1"), Interval("G", 4 * H, 12 * H, "b:1"), Interval("G", 5 * H, 6 * H, "c:1"),
           Interval("K", 0, 3 * H, "a:1")]
    out, overlaps = without_overlaps(ivs)
    assert sorted((iv.gpu, iv.start_ms, iv.end_ms, iv.job) for iv in out) == [
        ("G", 0, 10 * H, "a:1"), ("G", 10 * H, 12 * H, "b:1"), ("K", 0, 3 * H, "a:1")]
    assert overlaps == [Overlap("G", "a:1", "b:1", 4 * H, 10 * H), Overlap("G", "a:1", "c:1", 5 * H, 6 * H)]


def test_two_allocations_of_one_cloud_gpu_at_once_are_charged_once_and_idle_never_goes_negative():
    gpu = GpuTerms(uuid="G", model="H200", ownership="cloud", pool="burst", cloud_hourly=Decimal("4"),
                   in_fleet_since=MAR)
    t = MAR + timedelta(days=2)
    records = [_record("a", "G", t, 10), _record("b", "G", t + timedelta(hours=5), 10, team="cv")]
    usage = UsageColumns.of(records)
    inp = Inputs(usage, costing.charged_intervals(usage, APR), {"G": gpu}, Series({}), {})
    c = costing.compute(inp, BOOK, MAR, APR)
    assert c.cb.jobs["a:1"].usd == Decimal("40.000000") and c.cb.jobs["b:1"].usd == Decimal("20.000000")
    assert c.cb.idle_usd == Decimal(4 * 744 - 60) and c.cb.idle_usd >= 0
    report = costs_report(c, "team", False)
    assert report["overlaps"] == [{"gpu": "G", "charged": "a:1", "not_charged": "b:1",
                                   "from": (t + timedelta(hours=5)).isoformat(),
                                   "to": (t + timedelta(hours=10)).isoformat()}]
    assert any("GPU G was allocated to both a:1 and b:1" in n and "5.00 h" in n for n in report["pricing"]["notes"])


# --------------------------------------------------------------------------- forecasts


def _weeks(*totals: float, start: date = date(2026, 2, 2)) -> dict[date, Decimal]:
    """Daily spend: each week's total spread evenly over its seven days, from the Monday `start`."""
    daily: dict[date, Decimal] = {}
    for w, total in enumerate(totals):
        for d in range(7):
            daily[start + timedelta(weeks=w, days=d)] = Decimal(str(total)) / 7
    return daily


CLUSTER = Budget(scope="cluster", amount_usd=Decimal(10**9))


def test_the_weekly_forecast_is_the_mean_of_all_four_weeks_before():
    # The oldest week had the most spend: a 3-week mean would call a week 3% above the 4-week mean +20%.
    daily = _weeks(1000, 600, 600, 600, 721)
    assert week_forecast(daily, date(2026, 3, 2)) == Decimal(700)
    now = datetime(2026, 3, 9, 1, tzinfo=UTC)  # the Monday after
    assert [a for a in evaluate(CLUSTER, daily, now).alerts if a.rule == "SpendAboveForecast"] == []
    # A first week with spend that began mid-week is partial: left out.
    partial = {**_weeks(0, 700, 700, 700), date(2026, 2, 6): Decimal(50)}
    assert week_forecast(partial, date(2026, 3, 2)) == Decimal(700)


def test_the_current_weeks_overrun_is_raised_during_the_week():
    daily = _weeks(700, 700, 700, 700)
    monday = date(2026, 3, 2)
    for d in range(3):  # Monday to Wednesday: $300 a day, already above 115% of the $700 forecast
        daily[monday + timedelta(days=d)] = Decimal(300)
    status = evaluate(CLUSTER, daily, datetime(2026, 3, 4, 18, tzinfo=UTC))
    [alert] = [a for a in status.alerts if a.rule == "SpendAboveForecast"]
    assert alert.event_id == "raised-cost-week-cluster-all-20260302"  # the same id the Monday after would use
    assert "so far in the week of 2026-03-02" in alert.summary and "$900.00 against $700.00" in alert.summary


def test_backtest_on_seasonal_spend_no_false_alarm_in_normal_weeks_and_an_overrun_caught_midweek():
    rng = random.Random(5)
    start = date(2026, 1, 5)
    daily: dict[date, Decimal] = {}
    overrun_week = 20
    for day in range(7 * 30):
        d = start + timedelta(days=day)
        weekday = 1.0 if d.weekday() < 5 else 0.4  # weekends quieter
        growth = 1 + 0.004 * (day / 7)  # slow growth, 0.4% a week
        noise = rng.uniform(0.95, 1.05)
        boost = 1.35 if day // 7 == overrun_week else 1.0
        daily[d] = Decimal(str(round(100 * weekday * growth * noise * boost, 2)))
    fired: dict[str, date] = {}
    for day in range(7 * 5, 7 * 30):
        now = datetime.combine(start + timedelta(days=day), datetime.min.time(), UTC) + timedelta(hours=23)
        seen = {d: v for d, v in daily.items() if d <= now.date()}
        for a in evaluate(CLUSTER, seen, now).alerts:
            if a.rule == "SpendAboveForecast":
                fired.setdefault(a.labels["week"], now.date())
    week = (start + timedelta(weeks=overrun_week)).isoformat()
    assert list(fired) == [week]  # no other week raised
    assert fired[week] < start + timedelta(weeks=overrun_week + 1)  # during the week itself


# --------------------------------------------------------------------------- FOCUS 1.3


def _spec13(dataset: str) -> dict[str, dict]:
    import csv
    from pathlib import Path

    with open(Path(__file__).parent / "data" / "focus" / "focus-1.3-columns.csv") as fh:
        return {r["ColumnID"]: r for r in csv.DictReader(fh) if r["Dataset"] == dataset}


def test_focus_13_leases_are_commitments_with_used_and_unused_time_and_a_partial_window_bills_its_part():
    import csv
    import io

    from whaleflux.billing.commitments import COMMITMENT_COLUMNS, commitment_rows
    from whaleflux.billing.exports import focus_csv, focus_rows
    from whaleflux.billing.ownership import gpu_cost, to_ms

    terms = [GpuTerms(uuid=f"L{i}", model="H200", ownership="leased", pool="cloud", lease_contract="CW-1",
                      lease_provider="coreweave", lease_monthly=Decimal("2150.00"), lease_start=date(2026, 1, 1),
                      lease_end=date(2026, 12, 31)) for i in range(2)]
    lo, hi = MAR + timedelta(days=10), MAR + timedelta(days=20)  # a third of March, 31 days
    gpus = {t.uuid: gpu_cost(t, BOOK_LEASE, lo, hi) for t in terms}
    t0 = to_ms(lo) + H
    ivs = [Interval("L0", t0, t0 + 10 * H, "a:1")]
    from whaleflux.billing.allocation import JobInfo

    rows = list(csv.DictReader(io.StringIO(focus_csv(focus_rows(ivs, {"a:1": JobInfo("a", 1, "nlp", "p", "H200")},
                                                                gpus, to_ms(lo), to_ms(hi))))))
    spec = _spec13("CostAndUsage")
    assert {c for c, r in spec.items() if r["FeatureLevel"] == "Mandatory"} <= set(rows[0])
    used = [r for r in rows if r["x_JobId"] == "a"]
    unused = [r for r in rows if r["ChargeCategory"] == "Usage" and r["x_Idle"] == "true"]
    fees = [r for r in rows if r["ChargeCategory"] == "Purchase"]
    assert {r["CommitmentDiscountId"] for r in rows} == {"CW-1"}
    assert [r["CommitmentDiscountStatus"] for r in used] == ["Used"]
    assert {r["CommitmentDiscountStatus"] for r in unused} == {"Unused"} and len(unused) == 2
    applied = json.loads(used[0]["ContractApplied"])["Elements"][0]
    assert applied["ContractCommitmentId"] == "CW-1" and applied["ContractCommitmentAppliedUnit"] == "GPU-Hours"
    # The window holds 10 of March's 31 days: each GPU's fee row bills that part, not the whole month.
    assert {Decimal(r["BilledCost"]) for r in fees} == {(Decimal("2150") * 10 / 31).quantize(Decimal("0.000001"))}
    effective = sum(Decimal(r["EffectiveCost"]) for r in rows)
    assert abs(effective - Decimal("2150") * 2 * 10 / 31) < Decimal("0.0001")

    [commitment] = list(csv.DictReader(io.StringIO(focus_csv(commitment_rows(gpus), COMMITMENT_COLUMNS))))
    cc = _spec13("ContractCommitment")
    assert set(cc) <= set(commitment)
    assert all(commitment[c] for c, r in cc.items() if r["AllowsNulls"] == "False")
    assert commitment["ContractCommitmentId"] == commitment["ContractId"] == "CW-1"
    assert commitment["ContractCommitmentQuantity"] == "24.000000"  # 2 GPUs x 12 months
    assert commitment["ContractCommitmentCost"] == "51600.000000"
    assert commitment["ContractCommitmentUnit"] == "GPU-Months"
    assert commitment["ContractCommitmentPeriodStart"] == "2026-01-01T00:00:00Z"
    assert commitment["ContractCommitmentPeriodEnd"] == "2027-01-01T00:00:00Z"


# --------------------------------------------------------------------------- budget alerts resolve


def test_a_budget_alert_resolves_when_the_projection_falls_back_or_the_month_ends_and_fires_again_later():
    budget = Budget(scope="team", name="nlp", amount_usd=Decimal("1000"), thresholds_pct=[80])
    first = {date(2026, 3, d): Decimal(100) for d in range(1, 10)}  # $900 by 9 March: projected far past 80%
    now = datetime(2026, 3, 10, tzinfo=UTC)
    [due] = evaluate(budget, first, now).alerts
    assert due.ends_at == APR  # alerting resolves it with March at the latest
    [(eid, raised, state)] = alert_changes([due], {}, now)
    assert eid == "raised-cost-budget-team-nlp-202603-80" and isinstance(raised, AlertRaised)
    assert raised.ends_at == APR and raised.labels["alertname"] == "BudgetProjection" and state.firing
    firing = {raised.fingerprint: state}
    assert alert_changes([due], firing, now + timedelta(hours=1)) == []  # still due: nothing new

    later = now + timedelta(hours=2)  # spend corrected down: no longer due
    assert evaluate(budget, {date(2026, 3, 1): Decimal(10)}, later).alerts == ()
    [(eid, resolved, state)] = alert_changes([], firing, later)
    assert eid == "resolved-cost-budget-team-nlp-202603-80-1" and isinstance(resolved, AlertResolved)
    assert (resolved.starts_at, resolved.ends_at, resolved.labels) == (now, later, raised.labels)
    assert not state.firing and alert_changes([], {raised.fingerprint: state}, later) == []

    [(eid, _, state)] = alert_changes([due], {raised.fingerprint: state}, later)  # due again: its 2nd firing
    assert eid == "raised-cost-budget-team-nlp-202603-80-2" and state.count == 2
    april = APR + timedelta(hours=1)  # the month is over: March's alert is not due in April
    assert evaluate(budget, first, april).alerts == ()
    [(eid, _, _)] = alert_changes([], {raised.fingerprint: state}, april)
    assert eid == "resolved-cost-budget-team-nlp-202603-80-2"
