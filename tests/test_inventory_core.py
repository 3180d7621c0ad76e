"""The inventory's pure core: declarations, reconciliation, lease notices, rollups and findings (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from whaleflux.inventory import findings as fnd
from whaleflux.inventory.allocations import JobChange, allocated_at, allocation_key, job_change
from whaleflux.inventory.assets import AssetsError, parse_declarations
from whaleflux.inventory.discovery import discovered, gpu_rows, seen
from whaleflux.inventory.leases import due_notices, leases, notice_event
from whaleflux.inventory.reconcile import DiscoveredGpu, reconcile
from whaleflux.inventory.rollups import Allocation, UtilSums, allocated_time, rollup
from whaleflux.inventory.views import grouped
from whaleflux.shared.contracts import Holder
from whaleflux.shared.events import (
    GpuIdentity,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobSubmitted,
    LeaseExpiring,
    NodeHeartbeat,
    NodeRegistered,
    make_envelope,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

GOOD = """\
contracts:
  - id: CW-1
    provider: coreweave
    start: 2026-01-01
    end: 2026-03-31
    monthly_price_per_gpu: "1890.00"
    notice_days: 30
assets:
  - node: a100-01
    model: A100
    gpus: 8
    ownership: leased
    pool: cloud
    site: east
    leases: [CW-1]
  - node: h100-01
    ownership: owned
    pool: onprem
    purchase: {price_per_gpu: "36000", date: 2025-01-01, depreciation_months: 36}
"""


def _gpus(node: str, model: str, n: int, pool: str = "p", registered: datetime = T0) -> list[DiscoveredGpu]:
    return [DiscoveredGpu(f"{node}-g{i}", i, model, node, "c", "r1", pool, "active", registered, registered)
            for i in range(n)]


def _errors(text: str) -> list[str]:
    with pytest.raises(AssetsError) as exc:
        parse_declarations(text, "assets.yaml")
    return exc.value.errors


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("    model: A100\n", "    model: Z900\n", "assets.yaml:10: assets[0].model: unknown model 'Z900'"),
        ("    end: 2026-03-31\n", "    end: 2025-03-31\n",
         "assets.yaml:5: contracts[0].end: end 2025-03-31 is before start"),
        ('"1890.00"', '"-1"',
         "assets.yaml:6: contracts[0].monthly_price_per_gpu: Input should be greater than or equal to 0"),
        ("ownership: owned", "ownership: borrowed", "assets.yaml:17: assets[1].ownership: Input should be"),
        ("leases: [CW-1]", "leases: [CW-9]", "assets.yaml:15: assets[0].leases[0]: unknown contract 'CW-9'"),
    ],
)
def test_bad_declarations_name_file_line_and_key(old, new, expected):
    errors = _errors(GOOD.replace(old, new))
    assert any(e.startswith(expected) for e in errors), errors


def test_overlapping_leases_for_one_node_are_rejected_at_the_later_contract():
    text = GOOD.replace(
        "assets:\n",
        "  - {id: CW-2, provider: x, start: 2026-03-15, end: 2026-06-30, monthly_price_per_gpu: 1}\nassets:\n",
    ).replace("leases: [CW-1]", "leases: [CW-1, CW-2]")
    [error] = _errors(text)
    assert error.startswith("assets.yaml:16: assets[0].leases[1]: contract CW-2") and "overlaps CW-1" in error


def test_yaml_syntax_error_names_the_line():
    [error] = _errors("assets:\n  - node: [a\n")
    assert error.startswith("assets.yaml:3: (yaml):")


def test_reconcile_flags_undeclared_and_never_seen_and_prices_each_gpu():
    decl = parse_declarations(GOOD)
    discovered = _gpus("a100-01", "A100", 8) + _gpus("r4090-01", "RTX4090", 4)
    rec = reconcile(decl, discovered, T0 + timedelta(days=10))
    by_node = {a.node: a for a in rec.assets}
    assert by_node["a100-01"].ownership == "leased" and by_node["a100-01"].monthly_cost == Decimal("1890.00")
    assert by_node["a100-01"].site == "east" and by_node["a100-01"].pool == "cloud"
    assert by_node["r4090-01"].ownership == "owned-unknown" and not by_node["r4090-01"].declared
    assert len(rec.undeclared) == 4
    assert rec.never_seen == ["node h100-01 (owned, pool onprem) is declared but never registered"]


def test_a_cloud_gpus_declared_start_reaches_billings_view_and_a_leased_one_is_refused():
    from whaleflux.inventory.views import asset

    text = GOOD + "  - {node: h200-c1, ownership: cloud, hourly_price_per_gpu: \"4.00\", since: 2026-11-01}\n"
    rec = reconcile(parse_declarations(text), _gpus("h200-c1", "H200", 1), T0)
    [cloud] = [asset(a) for a in rec.assets if a.node == "h200-c1"]
    assert cloud.since == datetime(2026, 11, 1).date() and cloud.hourly_price_per_gpu_usd == Decimal("4.00")
    [error] = _errors(GOOD.replace("    leases: [CW-1]\n", "    leases: [CW-1]\n    since: 2026-01-01\n"))
    assert error.startswith("assets.yaml:") and "assets[0].since: a leased asset starts with its contract" in error


def test_lease_dates_are_shown_as_declared_and_the_notice_deadline_as_the_last_day_to_give_notice():
    from whaleflux.inventory.views import lease_row

    text = GOOD.replace("end: 2026-03-31", "end: 2027-04-30")
    decl = parse_declarations(text)
    now = datetime(2027, 3, 15, tzinfo=UTC)
    rec = reconcile(decl, _gpus("a100-01", "A100", 8), now)
    [lease] = leases(decl, rec.assets, now)
    row = lease_row(lease, now)
    assert row.covered_through == datetime(2027, 4, 30).date() and row.ends_at == datetime(2027, 5, 1, tzinfo=UTC)
    assert row.notice_by == datetime(2027, 3, 31).date()  # 30 days' notice: the deadline is 1 April 00:00
    [notice] = due_notices([lease], (30,), now, set())[0]
    summary = notice_event(notice, now).summary
    assert "2027-05-01" not in summary and "2027-04-30" in summary, summary
    assert "last day to give notice 2027-03-31" in summary or "give notice by 2027-03-31" in summary, summary


def test_owned_gpus_are_valued_as_billing_charges_them_and_depreciated_ones_say_so():
    from whaleflux.inventory.valuation import revalue, valuation
    from whaleflux.shared.contracts.billing import PriceBookView

    book = PriceBookView.model_validate({"entries": [
        {"model": "H100", "ownership": "owned", "effective_from": "2026-01-01", "usd_per_kwh": "0.20",
         "overhead_per_gpu_month": "600"}]})
    now = T0 + timedelta(days=10)
    fresh = reconcile(parse_declarations(GOOD), _gpus("h100-01", "H100", 2), now)
    # Without billing's prices: amortization only ($36,000 / 36 = $1,000), and said so.
    assert [a.monthly_cost for a in fresh.assets] == [Decimal("1000.00")] * 2
    assert valuation(fresh.assets) == " (owned: amortization only; billing's price book not known to inventory)"
    # With them: + $600 overhead + idle power (the catalogue's H100 idle draw x 730 h x $0.20/kWh).
    from whaleflux.shared.catalog import gpu_models

    power = Decimal(str(gpu_models()["H100"].idle_power_w)) * 730 / 1000 * Decimal("0.20")
    valued = revalue(fresh.assets, book, now)
    assert [a.monthly_cost for a in valued] == [(Decimal(1600) + power).quantize(Decimal("0.01"))] * 2
    assert valuation(valued) == " (owned: amortization + overhead + idle power, as billing prices them)"
    # Fully depreciated: overhead and power still at stake, and the summary says why the amortization is 0.
    old = GOOD.replace("date: 2025-01-01, depreciation_months: 36", "date: 2022-01-01, depreciation_months: 36")
    spent = revalue(reconcile(parse_declarations(old), _gpus("h100-01", "H100", 2), now).assets, book, now)
    assert [a.monthly_cost for a in spent] == [(Decimal(600) + power).quantize(Decimal("0.01"))] * 2
    assert valuation(spent).endswith("; 2 fully depreciated: overhead and power only)")
    leased = reconcile(parse_declarations(GOOD), _gpus("a100-01", "A100", 8), now)
    assert revalue(leased.assets, book, now)[0].monthly_cost == Decimal("1890.00") and valuation(leased.assets) == ""


def _notices(decl, discovered, now, fired, horizons=(30, 7, 1)):
    rec = reconcile(decl, discovered, now)
    return due_notices(leases(decl, rec.assets, now), horizons, now, fired)


def test_each_horizon_fires_once_and_a_late_start_announces_only_the_nearest():
    decl = parse_declarations(GOOD)  # ends 2026-04-01 00:00, notice deadline 2026-03-02
    gpus = _gpus("a100-01", "A100", 8)
    end = datetime(2026, 4, 1, tzinfo=UTC)
    fired: set[str] = set()
    published = []
    for now in [end - timedelta(days=31), end - timedelta(days=29), end - timedelta(days=28),
                end - timedelta(days=6), end - timedelta(hours=12), end - timedelta(hours=11)]:
        publish, done = _notices(decl, gpus, now, fired)
        published += [n.event_id for n in publish]
        fired |= set(done)
    assert published == [
        # 31 days before the end is 1 day before the notice deadline: the 30- and 7-day notice
        # horizons are already reached, so only the 1-day one is announced.
        "lease-expiring-CW-1-1d-notice-20260302",
        "lease-expiring-CW-1-30d-end-20260401",
        "lease-expiring-CW-1-7d-end-20260401",
        "lease-expiring-CW-1-1d-end-20260401",
    ]
    publish, _ = _notices(decl, gpus, end + timedelta(minutes=1), fired)
    assert [n.event_id for n in publish] == ["lease-expired-CW-1-20260401"]


def test_expiring_event_says_what_expires_and_that_notice_passed():
    decl = parse_declarations(GOOD)
    now = datetime(2026, 3, 25, tzinfo=UTC)
    [notice], _ = _notices(decl, _gpus("a100-01", "A100", 8), now, set())
    event = notice_event(notice, now)
    assert isinstance(event, LeaseExpiring)
    assert event.summary.startswith("1 leased A100 node (8 GPUs) of contract CW-1 (coreweave) expire in 7 days")
    assert "notice deadline passed — renew or release?" in event.summary
    assert event.monthly_cost_usd == "15120.00" and event.gpu_count == 8 and event.notice_deadline_passed


def test_renewal_by_a_later_end_date_or_a_contiguous_contract_stops_the_notices():
    now = datetime(2026, 3, 28, tzinfo=UTC)
    gpus = _gpus("a100-01", "A100", 8)
    extended = parse_declarations(GOOD.replace("end: 2026-03-31", "end: 2026-09-30"))
    assert _notices(extended, gpus, now, set()) == ([], [])
    successor = parse_declarations(
        GOOD.replace("assets:\n", "  - {id: CW-2, provider: x, start: 2026-04-01, end: 2026-12-31,"
                                  " monthly_price_per_gpu: 1}\nassets:\n")
        .replace("leases: [CW-1]", "leases: [CW-1, CW-2]")
    )
    assert _notices(successor, gpus, now, set()) == ([], [])


def test_auto_renewing_lease_rolls_forward_instead_of_expiring():
    decl = parse_declarations(GOOD.replace("notice_days: 30", "notice_days: 0\n    auto_renew: true"))
    now = datetime(2026, 4, 25, tzinfo=UTC)
    [lease] = leases(decl, reconcile(decl, _gpus("a100-01", "A100", 8), now).assets, now)
    assert lease.term_end == datetime(2026, 5, 1, tzinfo=UTC)
    publish, _ = _notices(decl, _gpus("a100-01", "A100", 8), now, set())
    assert [n.event_id for n in publish] == ["lease-expiring-CW-1-7d-end-20260501"]


def test_allocated_time_is_split_exactly_across_hours():
    a = Allocation("j:1", ("g0", "g1"), T0 + timedelta(minutes=30), T0 + timedelta(hours=2, seconds=5))
    got = allocated_time([a], T0, T0 + timedelta(days=1), T0 + timedelta(days=1))
    assert got[("g0", T0)] == timedelta(minutes=30)
    assert got[("g1", T0 + timedelta(hours=1))] == timedelta(hours=1)
    assert got[("g0", T0 + timedelta(hours=2))] == timedelta(seconds=5)


def test_pool_rollup_reports_fraction_and_mean_utilization_while_allocated():
    groups = {"g0": "p", "g1": "p"}
    allocs = [Allocation("j:1", ("g0",), T0, None)]
    util = {("g0", T0): UtilSums(allocated_sum=90.0, allocated_n=2, total_sum=90.0, total_n=2),
            ("g1", T0): UtilSums(total_sum=0.0, total_n=2)}
    [row] = rollup(groups, allocs, util, T0, T0 + timedelta(hours=1), T0 + timedelta(hours=1))
    assert row.allocated_s == 3600 and row.allocated_fraction == 0.5
    assert row.mean_util_allocated == 45.0 and row.mean_util == 22.5


def test_reserved_idle_finding_states_hours_and_money():
    decl = parse_declarations(GOOD)
    now = T0 + timedelta(days=14)
    rec = reconcile(decl, _gpus("a100-01", "A100", 8), now)
    [finding] = fnd.reserved_idle(rec.assets, {}, now, min_hours=72)
    assert finding.summary == "8x A100 (leased, pool cloud) idle 336 h — $15,120.00/month"
    assert finding.monthly_usd == Decimal("15120.00")


def test_under_used_pool_gets_a_consolidation_recommendation():
    decl = parse_declarations(GOOD)
    now = T0 + timedelta(days=3)
    rec = reconcile(decl, _gpus("a100-01", "A100", 8), now)
    groups = {a.uuid: a.pool for a in rec.assets}
    # Two GPUs busy for two hours a day, nothing else.
    allocs = [Allocation(f"j{d}:1", ("a100-01-g0", "a100-01-g1"), T0 + timedelta(days=d, hours=9),
                         T0 + timedelta(days=d, hours=11))
              for d in range(3)]
    rows = rollup(groups, allocs, {}, T0, now, now)
    [finding] = fnd.consolidation(rows, rec.assets, threshold=0.3, days=3)
    assert "pool cloud: 8 GPUs 2% allocated" in finding.summary
    assert "consolidating onto 2 would free 6" in finding.summary
    assert finding.monthly_usd == Decimal("11340.00")


def test_capacity_counts_free_gpus_and_whole_free_nodes():
    decl = parse_declarations(GOOD)
    rec = reconcile(decl, _gpus("a100-01", "A100", 8) + _gpus("a100-02", "A100", 8, pool="cloud"), T0)
    [row] = fnd.capacity(rec.assets, {"a100-01-g0"})
    assert (row.gpus, row.free, row.free_nodes) == (16, 15, 1)


def test_the_demo_fleets_assets_file_is_valid_and_covers_every_demo_node():
    from whaleflux.shared.catalog import load_fleet
    from whaleflux.shared.datafiles import DEFAULT_ASSETS

    declared = parse_declarations(DEFAULT_ASSETS.read_text(), str(DEFAULT_ASSETS))
    assert {a.node for a in declared.assets} == {n.name for n in load_fleet().nodes()}


def test_a_pool_younger_than_the_window_gets_no_consolidation_advice():
    from whaleflux.inventory.reconcile import GpuAsset
    from whaleflux.inventory.rollups import HourRow

    now = datetime(2026, 3, 10, tzinfo=UTC)
    start = now - timedelta(days=3)
    rows = [HourRow("cloud", start + timedelta(hours=h), 8, 0.0, 0.0, None, None) for h in range(72)]

    def asset(registered):
        return GpuAsset(uuid="g", index=0, model="H200", node="n", status="active", last_seen=now,
                        registered_at=registered, ownership="leased", declared=True, site=None, cluster="c",
                        rack=None, pool="cloud", monthly_cost=Decimal("2190"))
    assert fnd.consolidation(rows, [asset(now - timedelta(hours=2))]) == []
    [old] = fnd.consolidation(rows, [asset(start - timedelta(days=1))])
    assert old.kind == "consolidation" and "pool cloud" in old.summary


# --------------------------------------------------------------------------- discovery and allocation bookkeeping


def test_a_node_record_keeps_its_first_registration_and_last_seen_only_moves_forward():
    gpus = [GpuIdentity(uuid="GPU-0", index=0, model="A100", name="NVIDIA A100", memory_total_mib=81920)]
    reg = NodeRegistered(cluster="c", node="n1", pool="p", agent_version="t", gpus=gpus)
    beat = NodeHeartbeat(cluster="c", node="n1", seq=1)
    assert seen(None, T0, beat) is None  # a heartbeat before the registration: nothing to write
    first = seen(None, T0, reg)
    assert first is not None and first.registered_at == T0
    later = seen(first, T0 + timedelta(hours=1), beat)
    assert later is not None and later.last_seen == T0 + timedelta(hours=1)
    stale = seen(later, T0 + timedelta(minutes=5), beat)  # an old heartbeat redelivered
    assert stale is not None and stale.last_seen == T0 + timedelta(hours=1)
    again = seen(later, T0 + timedelta(hours=2), reg.model_copy(update={"pool": "q"}))
    assert again is not None and (again.registered_at, again.pool) == (T0, "q")
    rows = gpu_rows([again], T0 + timedelta(hours=2, seconds=31), timedelta(seconds=30))
    assert [(r.uuid, r.status) for r in rows] == [("GPU-0", "missing")]


def test_gpus_the_scheduler_keeps_out_count_as_missing_or_unhealthy_never_active():
    gpus = [GpuIdentity(uuid=f"GPU-{i}", index=i, model="H100", name="NVIDIA H100", memory_total_mib=81559)
            for i in range(4)]
    node = seen(None, T0, NodeRegistered(cluster="c", node="n1", pool="p", agent_version="t", gpus=gpus))
    assert node is not None
    cordons = {"GPU-0": "xid", "GPU-1": "missing", "GPU-2": "operator"}
    rows = gpu_rows([node], T0 + timedelta(seconds=1), timedelta(seconds=30), cordons)
    assert [r.status for r in rows] == ["unhealthy", "missing", "unhealthy", "active"]
    quiet = gpu_rows([node], T0 + timedelta(seconds=31), timedelta(seconds=30), cordons)
    assert {r.status for r in quiet} == {"missing"}, "a quiet node's GPUs are missing whatever the scheduler says"
    found = discovered([node], T0 + timedelta(seconds=1), timedelta(seconds=30), cordons)
    rec = reconcile(parse_declarations(GOOD, "assets.yaml"), found, T0)
    [row] = grouped(rec.assets, "model", set(), [])
    assert (row["gpus"], row["active"], row["missing"], row["unhealthy"]) == (4, 1, 1, 2)


def test_job_events_queue_open_and_close_allocations_per_attempt_and_gang_part():
    env = make_envelope(JobSubmitted(job_id="j", name="j", command=["x"], gpus=2), source="t", time=T0)
    submitted = job_change(env, JobSubmitted(job_id="j", name="j", command=["x"], gpus=2, gpu_models=["A100"]))
    assert submitted.queued == fnd.QueuedJob("j", 2, ("A100",), None)
    placed = JobPlaced(job_id="j", attempt=2, cluster="c", node="n2", gpu_model="A100", gpu_uuids=["g2", "g3"],
                       gpu_indices=[0, 1], command=["x"], team="t", project="p", rank=1)
    opened = job_change(env, placed)
    assert opened.dequeued == "j" and opened.opened == Allocation("j:2#r1", ("g2", "g3"), T0)
    finished = JobFinished(job_id="j", attempt=2, cluster="c", node="n2", exit_code=0, started_at=T0,
                           finished_at=T0 + timedelta(hours=1), rank=1)
    assert job_change(env, finished).closed == ("j:2#r1", T0 + timedelta(hours=1))
    assert job_change(env, JobRejected(job_id="k", reason="too big")) == JobChange(dequeued="k")
    holders = {"g2": Holder("j", 2, 1, since=T0), "g3": Holder("j", 2, 1, since=T0 + timedelta(minutes=1))}
    assert allocated_at(holders, ["g1", "g2", "g3"], T0 + timedelta(seconds=30)) == {"g2"}
    assert holders["g2"].part_key == allocation_key("j", 2, 1) and allocation_key("j", 2) == "j:2"
