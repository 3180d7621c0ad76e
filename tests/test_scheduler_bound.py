"""The idealized reference of bench/scheduler_bound.py on toy fleets: shortest remaining first, fastest
model first, jobs without a checkpoint pinned where they start. Pure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from scheduler_bound import Pool, idealized  # noqa: E402

from whaleflux.scheduler.simulator import SimJob  # noqa: E402

HOUR = 3600.0
ONE_A100 = [Pool("A100", 1, 80, 8, 1.0)]


def job(job_id, submit_h, hours, workload="llm-train", gpus=1, vram=10):
    return SimJob(job_id, submit_h * HOUR, hours * HOUR, gpus, "t", workload, vram, "normal", False)


def test_a_shorter_arrival_stops_a_job_that_keeps_a_checkpoint():
    # "long" (10 h) runs from 0; "short" (1 h) arrives at 1 h and runs at once: JCTs 11 h and 1 h.
    assert idealized([job("long", 0, 10), job("short", 1, 1)], ONE_A100, "live-movable") == pytest.approx(6 * HOUR)


def test_a_job_without_a_checkpoint_runs_to_its_end_unless_every_job_may_move():
    jobs = [job("long", 0, 10, workload="inference"), job("short", 1, 1)]
    assert idealized(jobs, ONE_A100, "live-movable") == pytest.approx(10 * HOUR)  # "short" waits 9 h
    assert idealized(jobs, ONE_A100, "free") == pytest.approx(6 * HOUR)
    assert idealized([job("long", 0, 10), job("short", 1, 1)], ONE_A100, "no-stops") == pytest.approx(10 * HOUR)


def test_each_job_takes_the_fastest_model_with_memory_enough():
    fleet = [Pool("A100", 1, 80, 8, 1.0), Pool("H100", 1, 80, 8, 1.0), Pool("RTX4090", 1, 24, 4, 0.75)]
    # llm-train: H100 2.6x, A100 1x; 40 GB fits no RTX 4090. Both start at 0: the shorter on the H100.
    jobs = [job("a", 0, 2.6, vram=40), job("b", 0, 5.2, vram=40)]
    # b: 1 A100 h done on the A100 until a ends at 1 h, then its 4.2 h left at 2.6x on the H100.
    assert idealized(jobs, fleet, "free") == pytest.approx((1 + 1 + 4.2 / 2.6) / 2 * HOUR)


def test_a_job_the_fleet_cannot_hold_is_refused_by_name():
    with pytest.raises(ValueError, match="big: the fleet cannot hold it"):
        idealized([job("big", 0, 1, gpus=2)], ONE_A100, "free")
