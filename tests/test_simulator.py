"""Trace simulator: metrics on tiny workloads checked by hand; no I/O but a temp CSV."""

from __future__ import annotations

import pytest

from whaleflux.scheduler.placement import GpuState, Interconnects, ModelFacts, NodeState
from whaleflux.scheduler.queueing import BACKFILL, FIFO, WHALEFLUX
from whaleflux.scheduler.simulator import SimJob, read_jobs, simulate

FACTS = {"A100": ModelFacts("A100", {"small": 1.0, "llm-train": 1.0}), "H100": ModelFacts("H100", {"small": 1.5, "llm-train": 2.5})}


def node(name, model="A100", gpus=1, link="nvlink"):
    return NodeState(name, "c", model, link, tuple(GpuState(f"{name}-{i}", i, 81920) for i in range(gpus)))


def sim_job(job_id, submit, duration, gpus=1, klass="small", team="t", priority="normal"):
    return SimJob(job_id, submit, duration, gpus, team, klass, 10, priority, priority == "low")


def test_two_jobs_on_one_gpu_queue_and_report_hand_checked_metrics():
    jobs = [sim_job("j1", 0, 100), sim_job("j2", 10, 50, team="u")]
    r = simulate(jobs, [node("a")], FIFO, FACTS)
    # j1 runs 0-100, j2 waits 10-100 and runs 100-150.
    assert (r.finished, r.mean_jct_s, r.p50_jct_s, r.p99_jct_s) == (2, 120.0, 100.0, 140.0)
    assert r.mean_queueing_s == 45.0 and r.makespan_s == 150.0
    assert r.utilization == 1.0 and r.busy_utilization == 1.0
    assert {t.team: round(t.share, 3) for t in r.teams} == {"t": 0.667, "u": 0.333}
    assert {t.team: t.mean_slowdown for t in r.teams} == {"t": 1.0, "u": 2.8}


def test_runtime_scales_with_the_class_speed_and_the_interconnect():
    links = Interconnects(nvlink=1.0, pcie=0.75, cross_node=0.9)
    one = simulate([sim_job("j", 0, 300, klass="llm-train")], [node("h", "H100")], WHALEFLUX, FACTS, links)
    assert one.mean_jct_s == pytest.approx(300 / 2.5)
    pcie = simulate([sim_job("j", 0, 300, gpus=2)], [node("p", "A100", gpus=2, link="pcie")], WHALEFLUX, FACTS, links)
    assert pcie.mean_jct_s == pytest.approx(300 / 0.75)
    gang = simulate([sim_job("j", 0, 900, gpus=4)], [node("x", gpus=2), node("y", gpus=2)], WHALEFLUX, FACTS, links)
    assert gang.mean_jct_s == pytest.approx(900 / 0.9)


def test_backfill_fills_the_gap_that_fifo_leaves_idle():
    # One 2-GPU node: a 1-GPU job runs; a 2-GPU job waits; a short 1-GPU job can backfill.
    jobs = [sim_job("run", 0, 100), sim_job("big", 1, 100, gpus=2), sim_job("short", 2, 50)]
    fifo = simulate(jobs, [node("a", gpus=2)], FIFO, FACTS)
    easy = simulate(jobs, [node("a", gpus=2)], BACKFILL, FACTS)
    assert easy.backfilled == 1 and easy.mean_jct_s < fifo.mean_jct_s
    assert easy.makespan_s == 200.0  # "big" still starts at 100: backfill did not delay it


def test_whaleflux_puts_long_training_on_the_fast_gpu_where_first_fit_does_not():
    jobs = [sim_job("train", 0, 10_000, klass="llm-train")]
    fleet = [node("a100"), node("h100", "H100")]
    assert simulate(jobs, fleet, BACKFILL, FACTS).mean_jct_s == 10_000
    assert simulate(jobs, fleet, WHALEFLUX, FACTS).mean_jct_s == pytest.approx(4_000)


def test_high_priority_arrival_preempts_and_the_victim_resumes_its_work():
    jobs = [sim_job("low", 0, 2000, priority="low"), sim_job("urgent", 1000, 100, priority="high")]
    r = simulate(jobs, [node("a")], WHALEFLUX, FACTS, restart_overhead_s=60)
    # urgent runs 1000-1100; low did 1000 s, resumes at 1100 with 60 s overhead and 1000 s left.
    assert r.preemptions == 1 and r.makespan_s == 2160.0


def test_job_csv_is_read_sorted_and_stretched(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible\n"
        "b,20,60,1,t,small,8,low,true\n"
        "a,0,120,2,t,llm-train,40,normal,false\n"
    )
    jobs = read_jobs(path, time_scale=2.0)
    assert [j.job_id for j in jobs] == ["a", "b"] and jobs[1].submit_time_s == 40.0 and jobs[1].preemptible


def test_a_long_job_started_on_a_slow_gpu_moves_to_the_fast_one_when_it_frees_and_keeps_its_work():
    jobs = [sim_job("first", 0, 2500, klass="llm-train"), sim_job("long", 1, 100_000, klass="llm-train")]
    r = simulate(jobs, [node("a100"), node("h100", "H100")], WHALEFLUX, FACTS, restart_overhead_s=60)
    # "first" runs 0-1000 on the H100; "long" starts at 1 on the A100 (no waiting), did 999 s of work by
    # t=1000, then moves: 60 s restart + 99,001 / 2.5 s on the H100.
    assert r.migrations == 1 and r.preemptions == 0
    assert r.makespan_s == pytest.approx(1000 + 60 + 99_001 / 2.5)


def test_usable_busy_utilization_counts_only_gpus_a_waiting_job_could_use():
    small = NodeState("r", "c", "RTX4090", "pcie", (GpuState("r-0", 0, 24 * 1024),))
    jobs = [SimJob("j1", 0, 100, 1, "t", "small", 40, "normal", False), SimJob("j2", 0, 100, 1, "t", "small", 40, "normal", False)]
    r = simulate(jobs, [small, node("a")], FIFO, FACTS)
    # j2 waits 0-100 for the only 80 GB GPU while the 24 GB one is idle: strict 1 of 2 held, usable 1 of 1.
    assert r.busy_utilization == 0.5 and r.busy_utilization_usable == 1.0
