"""The charged intervals built as columns straight from the ledger's columns (usage.py, charged.py) are the object
path's (`metering.intervals` + `without_overlaps`), row for row and overlap for overlap, whether the columns come
from records or from the store's report rows. No I/O."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import numpy as np
import pytest

from whaleflux.billing import costing
from whaleflux.billing.allocation import GROUP_KEYS, Attempts, IntervalTable, chargeback, showback
from whaleflux.billing.allocation.columns import sum_by
from whaleflux.billing.charged import charged_table, record_table, without_overlaps_table
from whaleflux.billing.metering import UsageRecord, intervals, without_overlaps
from whaleflux.billing.ownership import GpuTerms, gpu_cost, to_ms
from whaleflux.billing.pricebook import reference_book
from whaleflux.billing.usage import UsageColumns, row

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _records(rng: random.Random, n: int, fine: bool = False) -> list[UsageRecord]:
    """Attempts on 12 GPUs over 3 days: overlaps, identical intervals of two attempts, zero-length and
    negative ones, running ones (some starting after `now`), gang parts, second attempts, no GPUs."""
    out = []
    for i in range(n):
        start = T0 + (timedelta(milliseconds=rng.randrange(3 * 86_400_000)) if fine else  # starts never equal
                      timedelta(minutes=rng.randrange(0, 3 * 24 * 60, rng.choice([1, 30, 60]))))
        hours = rng.choice([0, 0.5, 1, 2, 7, -1])
        end = None if rng.random() < 0.1 else start + timedelta(hours=hours)
        gpus = rng.sample([f"G{k}" for k in range(12)], rng.choice([0, 1, 1, 2, 4]))
        out.append(UsageRecord(job_id=f"j{rng.randrange(n // 2 + 1)}", attempt=rng.choice([1, 1, 2]),
                               team=f"t{i % 3}", project="p", gpu_model="H100", gpus=len(gpus), node="n",
                               gpu_uuids=gpus, started_at=start, ended_at=end, rank=rng.choice([0, 0, 1])))
        if rng.random() < 0.1 and not fine:  # another attempt with the very same interval on the same GPUs
            out.append(out[-1].model_copy(update={"job_id": f"k{i}"}))
    return out


def _columns(tab: IntervalTable) -> tuple[list[str], list[str], list[int], list[int], list[int], list[int]]:
    return (tab.gpus, tab.jobs, tab.gpu.tolist(), tab.start.tolist(), tab.end.tolist(), tab.job.tolist())


@pytest.mark.parametrize("seed", range(30))
def test_columns_from_records_equal_the_object_path_row_for_row(seed):
    rng = random.Random(seed)
    records = _records(rng, rng.choice([1, 5, 40, 300]), fine=seed % 3 == 0)
    now = T0 + timedelta(days=rng.choice([0, 1, 4]))
    ivs, jobs = intervals(records, now)
    kept, overlaps = without_overlaps(ivs)
    for usage in (UsageColumns.of(records), UsageColumns.decode(map(row, records))):  # from records; from rows
        assert _columns(record_table(usage, to_ms(now))) == _columns(IntervalTable.of(ivs))
        for small in (0, 10**6):  # on columns; as objects
            tab, jobs_c, overlaps_c = charged_table(usage, to_ms(now), small)
            assert _columns(tab) == _columns(IntervalTable.of(kept))
            assert overlaps_c == overlaps
            assert jobs_c == jobs


def _one_attempt_each(rng: random.Random, n: int, whole: bool) -> list[UsageRecord]:
    """Distinct attempts (some second ones), no gang, each holding GPUs on 48: overlaps cut in part, running
    ones; unless `whole`, some attempts cut out whole (the very same interval as another)."""
    out = []
    for i in range(n):
        start = T0 + timedelta(minutes=rng.randrange(0, 3 * 24 * 60))
        end = None if rng.random() < 0.02 else start + timedelta(minutes=rng.choice([30, 60, 120]))
        gpus = rng.sample([f"G{k}" for k in range(48)], rng.choice([1, 2, 4]))
        out.append(UsageRecord(job_id=f"j{i}", attempt=rng.choice([1, 1, 2]), team=f"t{rng.randrange(4)}",
                               project=f"p{rng.randrange(3)}", gpu_model="H100", gpus=len(gpus), node="n",
                               gpu_uuids=gpus, started_at=start, ended_at=end))
        if not whole and rng.random() < 0.05:
            out.append(out[-1].model_copy(update={"job_id": f"k{i}"}))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_a_chargeback_and_showback_from_the_attempts_as_columns_equal_the_object_paths(seed):
    """The attempts kept as the ledger's columns in the intervals' order (`Attempts` with rows, no object per
    attempt) give the same job costs, groups and shown lines, to the cent, as one `JobInfo` per attempt."""
    rng = random.Random(seed)
    records = _one_attempt_each(rng, rng.choice([40, 300]), seed % 2 == 0)
    now = T0 + timedelta(days=rng.choice([1, 4]))
    start, end = T0 + timedelta(hours=rng.randrange(24)), T0 + timedelta(days=3)
    book = reference_book()
    terms = [GpuTerms(uuid=f"G{k}", model="H100", ownership="owned", pool="onprem", purchase_price=Decimal("30000"),
                      purchase_date=date(2025, 3, 1), depreciation_months=48) if k % 2 else
             GpuTerms(uuid=f"G{k}", model="H100", ownership="cloud", pool="burst", in_fleet_since=T0)
             for k in range(48)]
    gpus = {t.uuid: gpu_cost(t, book, start, end) for t in terms}
    usage = UsageColumns.decode(map(row, records))
    columns = charged_table(usage, to_ms(now), 0)
    ivs, jobs = intervals(records, now)  # the object path: one JobInfo per attempt
    assert isinstance(columns.jobs, Attempts) and not isinstance(jobs, Attempts)
    whole = len(columns.table.jobs) == len(jobs)
    assert (columns.jobs.rows is not None) == whole  # the table's order read from the columns where none is cut out
    cb_c = chargeback(columns.table, columns.jobs, gpus, to_ms(start), to_ms(end))
    cb_o = chargeback(IntervalTable.of(without_overlaps(ivs)[0]), jobs, gpus, to_ms(start), to_ms(end))
    assert cb_c.jobs == cb_o.jobs and cb_c.groups == cb_o.groups and cb_c.notes == cb_o.notes
    for by in GROUP_KEYS:
        for share_idle in (False, True):
            for running in (False, True):
                assert showback(cb_c, by, share_idle, running) == showback(cb_o, by, share_idle, running)


@pytest.mark.parametrize("n", [50, 10**6])  # on a table of n sums; by a sort (n far above the keys)
def test_sums_by_key_are_each_keys_total_in_key_order(n):
    rng = random.Random(n)
    key = [rng.randrange(50) * (n // 50) for _ in range(300)]
    values = [rng.randrange(-5, 10**9) for _ in key]
    expected: dict[int, int] = {}
    for k, v in zip(key, values, strict=True):
        expected[k] = expected.get(k, 0) + v
    keys, sums = sum_by(np.array(key, dtype=np.int64), np.array(values, dtype=np.int64), n)
    assert list(zip(keys.tolist(), sums.tolist(), strict=True)) == sorted(expected.items())


@pytest.mark.parametrize("seed", range(10))
def test_report_rows_decode_to_the_records_columns_and_a_window_keeps_the_records_overlapping_it(seed):
    rng = random.Random(seed)
    records = _records(rng, 80, fine=seed % 2 == 0)
    usage = UsageColumns.decode(map(row, records))
    for name in ("job_id", "attempt", "rank", "team", "project", "node", "cluster"):
        assert getattr(usage, name) == [getattr(r, name) for r in records]
    distinct, which = usage.gpu_lists
    assert usage.model == [r.gpu_model for r in records]
    assert [distinct[w] for w in which.tolist()] == [r.gpu_uuids for r in records]
    assert usage.start.tolist() == [to_ms(r.started_at) for r in records]
    assert usage.running.tolist() == [r.ended_at is None for r in records]
    assert [e for e, r in zip(usage.end.tolist(), records, strict=True) if r.ended_at] == [
        to_ms(r.ended_at) for r in records if r.ended_at]
    lo = to_ms(T0 + timedelta(hours=rng.randrange(72)))
    hi = lo + rng.choice([1, 3_600_000, 86_400_000])
    window = usage.overlapping(lo, hi)
    assert window.keys == [r.key for r in records if to_ms(r.started_at) < hi and (
        r.ended_at is None or to_ms(r.ended_at) > lo)]
    assert UsageColumns.decode([]).keys == [] and len(UsageColumns.of([])) == 0


def test_the_first_holder_of_each_gpu_is_the_first_record_holding_it():
    records = _records(random.Random(3), 50)
    expected: dict[str, int] = {}
    for i, r in enumerate(records):
        for g in r.gpu_uuids:
            expected.setdefault(g, i)
    assert list(UsageColumns.of(records).first_holders()) == list(expected.items())


def test_overlaps_are_cut_on_columns_and_each_one_reported():
    h = 3_600_000
    tab = IntervalTable(["G", "K"], ["a:1", "b:1", "c:1"], np.array([0, 0, 0, 1]), np.array([0, 4 * h, 5 * h, 0]),
                        np.array([10 * h, 12 * h, 6 * h, 3 * h]), np.array([0, 1, 2, 0]))
    out, overlaps = without_overlaps_table(tab)
    assert sorted((iv.gpu, iv.start_ms, iv.end_ms, iv.job) for iv in out.rows()) == [
        ("G", 0, 10 * h, "a:1"), ("G", 10 * h, 12 * h, "b:1"), ("K", 0, 3 * h, "a:1")]
    assert [(o.kept, o.dropped, o.start_ms, o.end_ms) for o in overlaps] == [
        ("a:1", "b:1", 4 * h, 10 * h), ("a:1", "c:1", 5 * h, 6 * h)]


def test_sample_points_are_the_clipped_edges_of_the_charged_intervals():
    records = _records(random.Random(7), 60)
    start, end = T0 + timedelta(hours=20), T0 + timedelta(days=2)
    charged = costing.charged_intervals(UsageColumns.of(records), T0 + timedelta(days=3))
    points = costing.sample_points(charged.table, {}, start, end)
    expected: dict[str, set[int]] = {}
    for iv in without_overlaps(intervals(records, T0 + timedelta(days=3))[0])[0]:
        a, b = max(iv.start_ms, to_ms(start)), min(iv.end_ms, to_ms(end))
        if a < b:
            expected.setdefault(iv.gpu, set()).update((a, b))
    assert points == expected
