"""Issue 17's money rules on the pure core: overlaps charged once, reports that add up. No I/O."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from whaleflux.billing import costing
from whaleflux.billing.allocation import Interval
from whaleflux.billing.budgets import Budget, evaluate, week_forecast
from whaleflux.billing.costing import Inputs
from whaleflux.billing.energy import Series
from whaleflux.billing.metering import Overlap, UsageRecord, without_overlaps
from whaleflux.billing.ownership import GpuTerms
from whaleflux.billing.pricebook import parse_pricebook
from whaleflux.billing.report import costs_report

MAR = datetime(2026, 3, 1, tzinfo=UTC)
APR = datetime(2026, 4, 1, tzinfo=UTC)
BOOK = parse_pricebook("prices: []\n")
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
    inp = Inputs(records, {"G": gpu}, Series({}), {})
    c = costing.compute(inp, BOOK, MAR, APR, APR)
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
