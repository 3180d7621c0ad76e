"""Energy and utilization from the GPUs' own samples (energy.py, costing's pieces): exact over any window. No I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from whaleflux.billing.allocation import Interval
from whaleflux.billing.costing import energy_uses, utilization
from whaleflux.billing.energy import MAX_GAP_MS, Reading, Series, next_reading, readings
from whaleflux.billing.ownership import GpuCost, GpuTerms, to_ms
from whaleflux.shared.events import GpuSample, GpuTelemetry

T0 = datetime(2026, 3, 10, 8, tzinfo=UTC)
MIN = 60_000
H = 3_600_000
t0 = to_ms(T0)


def _batch(minutes: int, *gpus: tuple[str, float | None, float]) -> GpuTelemetry:
    samples = [GpuSample(uuid=u, index=i, model="H100", utilization_gpu_pct=util, memory_used_mib=1,
                         memory_total_mib=81559, temperature_c=50, energy_j=joules)
               for i, (u, joules, util) in enumerate(gpus)]
    return GpuTelemetry(cluster="c1", node="n1", seq=minutes, sample_time=T0 + timedelta(minutes=minutes), gpus=samples)


def _series(samples: list[tuple[int, float, float]]) -> list[Reading]:
    """Readings of one GPU from (minute, counter J, utilization %) samples, in order."""
    out: list[Reading] = []
    for minute, joules, util in samples:
        r = next_reading(out[-1] if out else None, t0 + minute * MIN, joules, util)
        assert r is not None
        out.append(r)
    return out


def test_a_reading_keeps_running_totals_and_a_redelivery_or_driver_reload_adds_nothing():
    first = next_reading(None, t0, 5e6, 50.0)
    assert first == Reading(t0, 5e6)  # a baseline: nothing drawn, nothing covered
    second = next_reading(first, t0 + MIN, 5.6e6, 80.0)
    assert second == Reading(t0 + MIN, 5.6e6, 6e5, 80.0 * MIN, MIN)
    assert next_reading(second, t0 + MIN, 5.6e6, 80.0) is None  # the same sample again
    reloaded = next_reading(second, t0 + 2 * MIN, 1e3, 10.0)
    assert reloaded is not None and reloaded.cum_j == 6e5 and reloaded.joules == 1e3  # a new baseline
    late = next_reading(reloaded, t0 + 2 * MIN + 3 * H, 2e3, 90.0)
    assert late is not None and late.cov_ms == reloaded.cov_ms + MAX_GAP_MS  # a gap stands for 15 minutes at most
    assert Reading.decode(late.encode()) == late
    assert Reading.decode(f"{t0}|7.5") == Reading(t0, 7.5)  # kept before the totals: a baseline


def test_a_batch_reads_each_gpu_against_its_last_reading():
    batch = _batch(20, ("G0", 19e6, 60.0), ("G1", 5e6, 0.0), ("G2", None, 10.0))
    t10 = t0 + 10 * MIN
    new = readings(batch, [Reading(t10, 1e6), None, Reading(t10, None), ])
    assert new["G0"].cum_j == 18e6 and new["G1"] == Reading(t0 + 20 * MIN, 5e6) and new["G2"].cum_j == 0
    assert readings(batch, [new["G0"], new["G1"], new["G2"]]) == {}  # redelivered


def test_energy_over_any_window_is_interpolated_at_its_edges_and_a_past_window_stays_fixed():
    # 1 MJ per 10 minutes, steadily, from minute 0 to minute 60.
    samples = [(m, 1e6 * m / 10, 50.0) for m in range(0, 61, 10)]
    s = Series({"G": _series(samples[:5])})  # up to minute 40 so far
    assert s.joules("G", t0 + 15 * MIN, t0 + 35 * MIN) == 2e6  # starts and ends mid-sample
    assert s.joules("G", t0 + 30 * MIN, t0 + 90 * MIN) == 1e6  # only what is known: up to the last sample
    assert s.joules("G", t0 - H, t0) == 0  # before the first sample
    later = Series({"G": _series(samples)})
    assert later.joules("G", t0 + 15 * MIN, t0 + 35 * MIN) == 2e6  # more samples do not change a past window
    u, c = later.utilization("G", t0 + 15 * MIN, t0 + 35 * MIN)
    assert c == 20 * MIN and u / c == 50.0


def _owned(uuid: str) -> GpuCost:
    return GpuCost(GpuTerms(uuid=uuid, model="H100", ownership="owned", pool="p"))


def test_a_job_that_starts_mid_hour_gets_the_energy_of_every_second_it_held_the_gpu():
    # 1.8 MJ per 10 minutes; the job holds G from 08:25 to 09:25, a window of the job alone.
    s = Series({"G": _series([(m, 1.8e6 * m / 10, 100.0) for m in range(0, 121, 10)])})
    ivs = [Interval("G", t0 + 25 * MIN, t0 + 85 * MIN, "j:1")]
    [use] = energy_uses(s, ivs, {"G": _owned("G")}, t0 + 25 * MIN, t0 + 85 * MIN)
    assert use.start_ms == t0 + 25 * MIN and use.total_j == 10.8e6 and use.by_job == (("j:1", 10.8e6),)
    # Over the whole day: cut at midnight, the job's part the same, the rest the GPU's own.
    day = energy_uses(s, ivs, {"G": _owned("G")}, t0 - 8 * H, t0 + 16 * H)
    assert [(u.start_ms, u.total_j, u.by_job) for u in day] == [(t0 - 8 * H, 21.6e6, (("j:1", 10.8e6),))]
    assert utilization(s, ivs, t0, t0 + 4 * H) == {"j:1": (100.0 * 60 * MIN, 60 * MIN)}


def test_a_long_finished_job_gets_no_energy_drawn_after_it_ended_whatever_the_order_of_arrival():
    # Samples after the job's end (live power) never count towards it: attribution is by time, not by holder.
    s = Series({"G": _series([(m, 1e6 * m, 90.0) for m in range(0, 31)])})
    finished = [Interval("G", t0 - 30 * 24 * H, t0 - 29 * 24 * H, "old:1")]
    assert energy_uses(s, finished, {"G": _owned("G")}, t0 - 31 * 24 * H, t0 + H)[-1].by_job == ()
    assert utilization(s, finished, t0 - 31 * 24 * H, t0 + H) == {}


def test_power_pieces_split_at_utc_midnight_so_a_days_price_applies_to_its_energy():
    midnight = to_ms(datetime(2026, 3, 11, tzinfo=UTC))
    s = Series({"G": [Reading(midnight - H, 0.0), Reading(midnight + H, 7.2e6, 7.2e6)]})
    uses = energy_uses(s, [], {"G": _owned("G")}, midnight - 2 * H, midnight + 2 * H)
    assert [(u.start_ms, u.total_j) for u in uses] == [(midnight - 2 * H, 3.6e6), (midnight, 3.6e6)]
    assert sum(Decimal(repr(u.total_j)) for u in uses) == Decimal("7.2e6")
