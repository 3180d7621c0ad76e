"""Trace simulator: metrics on tiny workloads checked by hand; no I/O but a temp CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import GpuState, Interconnects, ModelFacts, NodeState
from whaleflux.scheduler.queueing import BACKFILL, FIFO, WHALEFLUX
from whaleflux.scheduler.simulator import LIVE, ExecutorRules, SimJob, read_jobs, simulate, with_estimate_noise

FACTS = {"A100": ModelFacts("A100", {"small": 1.0, "llm-train": 1.0}),
         "H100": ModelFacts("H100", {"small": 1.5, "llm-train": 2.5})}


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
    r = simulate(jobs, [node("a")], WHALEFLUX, FACTS, rules=ExecutorRules(stop_s=0, resume_s=60))
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
    rules = ExecutorRules(stop_s=5, resume_s=60)
    r = simulate(jobs, [node("a100"), node("h100", "H100")], WHALEFLUX, FACTS, rules=rules)
    # "first" runs 0-1000 on the H100; "long" starts at 1 on the A100 (no waiting), did 999 s of work by
    # t=1000, is stopped, held until its old attempt ends (5 s), placed again at 1005 (the H100 is
    # still the best free placement): 60 s start-up + 99,001 / 2.5 s there.
    assert r.migrations == 1 and r.preemptions == 0
    assert r.makespan_s == pytest.approx(1005 + 60 + 99_001 / 2.5)
    (_, long) = r.outcomes
    assert (long.moves, long.models, long.first_start_s) == (1, ("A100", "H100"), 1.0)


def test_usable_busy_utilization_counts_only_gpus_a_waiting_job_could_use():
    small = NodeState("r", "c", "RTX4090", "pcie", (GpuState("r-0", 0, 24 * 1024),))
    jobs = [SimJob(j, 0, 100, 1, "t", "small", 40, "normal", False) for j in ("j1", "j2")]
    r = simulate(jobs, [small, node("a")], FIFO, FACTS)
    # j2 waits 0-100 for the only 80 GB GPU while the 24 GB one is idle: strict 1 of 2 held, usable 1 of 1.
    assert r.busy_utilization == 0.5 and r.busy_utilization_usable == 1.0


# ---------------------------------------------------------------- parity with the live executor


def test_a_job_that_fits_one_node_waits_for_one_instead_of_spanning_nodes_as_live():
    # Two 3-GPU nodes, two GPUs busy on each until t=1000; a 2-GPU job arrives at t=1.
    jobs = [sim_job("x", 0, 1000, gpus=2), sim_job("y", 0, 1000, gpus=2), sim_job("pair", 1, 500, gpus=2)]
    fleet = [node("a", gpus=3), node("b", gpus=3)]
    live = {o.job_id: o for o in simulate(jobs, fleet, WHALEFLUX, FACTS).outcomes}
    assert live["pair"].first_start_s == 1000.0  # waited for a node of its own
    split = simulate(jobs, fleet, WHALEFLUX, FACTS, rules=ExecutorRules(split_jobs_that_fit_one_node=True))
    assert {o.job_id: o for o in split.outcomes}["pair"].first_start_s == 1.0  # the old simulator's shortcut


def test_only_a_one_node_job_that_keeps_a_checkpoint_is_moved():
    fleet = [node("a100"), node("h100", "H100")]

    def moves(klass, preemptible=False, rules=LIVE):
        first = sim_job("first", 0, 2500, klass="llm-train")
        long = SimJob("long", 1, 100_000, 1, "t", klass, 10, "normal", preemptible)
        return simulate([first, long], fleet, WHALEFLUX, FACTS, rules=rules).migrations

    assert moves("llm-train") == 1  # a training job keeps checkpoints
    assert moves("small") == 0  # nothing says it does: never moved
    assert moves("small", preemptible=True) == 1  # it accepts a stop and a resume
    assert moves("small", rules=ExecutorRules(move_any_job=True)) == 1  # the old simulator moved every job
    pinned = SimJob("long", 1, 100_000, 1, "t", "llm-train", 10, "normal", False, checkpoint=False)
    assert simulate([sim_job("first", 0, 2500, klass="llm-train"), pinned], fleet, WHALEFLUX, FACTS).migrations == 0


def test_a_move_is_a_stop_a_hold_and_a_new_placement_wherever_the_job_then_fits():
    # "long" is moved off the A100 when the H100 frees at 1000; while it is held (its old attempt takes
    # 5 s to end) another long job arrives and takes the H100; "long" is placed again where it then fits.
    jobs = [sim_job("first", 0, 2500, klass="llm-train"), sim_job("long", 1, 100_000, klass="llm-train"),
            sim_job("late", 1002, 500_000, klass="llm-train")]
    rules = ExecutorRules(stop_s=5, resume_s=60)
    r = simulate(jobs, [node("a100"), node("h100", "H100")], WHALEFLUX, FACTS, rules=rules)
    out = {o.job_id: o for o in r.outcomes}
    assert out["late"].models == ("H100",) and out["late"].first_start_s == 1002.0
    assert out["long"].moves == 1 and out["long"].models == ("A100",)
    # 999 s done before the stop; 60 s start-up at 1005, then the rest on the A100.
    assert out["long"].finish_s == pytest.approx(1005 + 60 + 99_001)


def test_the_policy_plans_with_the_estimate_and_the_job_runs_its_true_duration():
    # One 2-GPU node: "short" (100 s, but says 1000 s) runs; "pair" needs both GPUs and reserves the
    # start at 1000 by that estimate; "fill" (500 s) backfills because it ends before then.
    def fill_start(estimate):
        jobs = [replace(sim_job("short", 0, 100), estimate_s=estimate), sim_job("pair", 1, 100, gpus=2),
                sim_job("fill", 2, 500)]
        r = simulate(jobs, [node("a", gpus=2)], BACKFILL, FACTS)
        out = {o.job_id: o for o in r.outcomes}
        assert out["short"].finish_s == 100.0  # the true duration, whatever it said
        return out["fill"].first_start_s, r.backfilled

    assert fill_start(1000.0) == (2.0, 1)
    assert fill_start(None) == (200.0, 0)  # exact: "fill" would delay "pair" (free at 100), so it waits


def test_estimate_noise_is_seeded_and_centred_on_the_true_runtime():
    jobs = [sim_job(f"j{i}", i, 1000) for i in range(2000)]
    noisy = with_estimate_noise(jobs, 0.5, seed=7)
    assert noisy == with_estimate_noise(jobs, 0.5, seed=7) != with_estimate_noise(jobs, 0.5, seed=8)
    ratios = sorted(j.expected_runtime_s / j.duration_s for j in noisy)
    assert 0.9 < ratios[len(ratios) // 2] < 1.1 and ratios[0] < 0.5 and ratios[-1] > 2.0
    assert with_estimate_noise(jobs, 0.0) == jobs
    with pytest.raises(ValueError, match="noise"):
        with_estimate_noise(jobs, -1.0)


def test_the_job_csv_may_give_estimates_and_checkpoints(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible,expected_runtime_s,checkpoint\n"
        "a,0,120,1,t,small,8,normal,false,600,true\n"
        "b,5,60,1,t,llm-train,8,normal,false,,false\n"
        "c,9,60,1,t,llm-train,8,normal,false,,\n"
    )
    a, b, c = read_jobs(path)
    assert (a.expected_runtime_s, a.keeps_checkpoint) == (600.0, True)
    assert (b.expected_runtime_s, b.keeps_checkpoint, c.keeps_checkpoint) == (60.0, False, True)
    path.write_text("job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible\n"
                    "a,0,soon,1,t,small,8,normal,false\n")
    with pytest.raises(ValueError, match=r"jobs.csv:2"):
        read_jobs(path)


def test_simulate_jobs_out_writes_one_row_per_job_and_policy_with_its_times_moves_and_models(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible\n"
        "first,0,2500,1,t,llm-train,10,normal,false\n"
        "long,1,100000,1,u,llm-train,10,normal,false\n"
        "never,2,100,1,t,small,500,normal,false\n"
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "name: two\ngroups:\n"
        "  - {name: a100, gpu_model: A100, nodes: 1, gpus_per_node: 1, interconnect: nvlink, cluster: c, pool: p,"
        " ownership: owned, racks: 1}\n"
        "  - {name: h100, gpu_model: H100, nodes: 1, gpus_per_node: 1, interconnect: nvlink, cluster: c, pool: p,"
        " ownership: owned, racks: 1}\n"
    )
    out = tmp_path / "rows.csv"
    done = subprocess.run([sys.executable, "-m", "whaleflux", "simulate", "--jobs", str(path), "--fleet", str(fleet),
                           "--policy", "backfill", "--policy", "whaleflux", "--jobs-out", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "outcomes" not in done.stdout and "6 job rows" in done.stderr
    rows = {(r["policy"], r["job_id"]): r for r in csv.DictReader(out.open())}
    assert sorted(rows) == [(p, j) for p in ("backfill", "whaleflux") for j in ("first", "long", "never")]
    moved = rows["whaleflux", "long"]
    # Started at once on the A100, moved to the H100 when "first" ended (H100 speed 2.6 for llm-train).
    assert (moved["team"], moved["submit_s"], moved["first_start_s"], moved["wait_s"]) == ("u", "1.0", "1.0", "0.0")
    assert (moved["moves"], moved["preemptions"], moved["models"]) == ("1", "0", "A100;H100")
    assert float(moved["jct_s"]) == pytest.approx(float(moved["finish_s"]) - 1.0)
    assert float(moved["pending_s"]) == pytest.approx(5.0, abs=0.2)  # held while its old attempt ended
    stayed = rows["backfill", "long"]  # first fit: "first" took the A100, "long" the H100, never moved
    assert (stayed["moves"], stayed["models"], stayed["finish_s"]) == ("0", "H100", f"{1 + 100_000 / 2.6:.1f}")
    never = rows["whaleflux", "never"]
    assert never["first_start_s"] == never["finish_s"] == "" and "500 GB" in never["rejected"]
