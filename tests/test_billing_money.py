"""Issue 17's money rules on the pure core: overlaps charged once, reports that add up. No I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from whaleflux.billing import costing
from whaleflux.billing.allocation import Interval
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
