"""`whaleflux trace prepare`: a public trace becomes the generic job CSV the simulator replays, from the
repository alone."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from whaleflux import traces
from whaleflux.traces import TraceJob, prepare

COLUMNS = "job_id,submit_time_s,duration_s,num_gpus,team,class,min_vram_gb,priority,preemptible".split(",")


def _jobs(n: int) -> list[TraceJob]:
    # Submitted out of order, some too short, one too big.
    return [
        TraceJob(
            f"j{i}", 1000.0 + (i * 37 % n) * 10, 30.0 if i % 5 == 0 else 600.0 + i, 2000 if i == 3 else 1 + i % 3, None
        )
        for i in range(n)
    ]


def test_jobs_are_filtered_sorted_made_relative_and_gaps_scaled():
    jobs = _jobs(50)
    out = prepare(jobs, seed=1, time_scale=2.0)
    kept = [j for j in jobs if j.duration_s >= 60 and j.duration_s * j.gpus / 3600 <= 1000]
    assert sorted(j.job_id for j in out) == sorted(j.job_id for j in kept)
    times = [j.submit_time_s for j in out]
    assert times == sorted(times) and times[0] == 0
    first = min(j.submit_s for j in kept)
    by_id = {j.job_id: j for j in kept}
    assert all(j.submit_time_s == (by_id[j.job_id].submit_s - first) * 2.0 for j in out)


def test_the_same_seed_gives_the_same_workload_and_another_seed_another():
    jobs = _jobs(200)
    a, b, c = prepare(jobs, seed=1), prepare(jobs, seed=1), prepare(jobs, seed=2)
    assert a == b and a != c
    assert {j.workload_class for j in a} <= {"small", "finetune", "inference", "llm-train"}
    assert {j.priority for j in a} == {"high", "normal", "low"}
    for j in a:
        lo, hi = traces.VRAM_RANGE_GB[j.workload_class]
        assert lo <= j.min_vram_gb <= hi
        assert j.num_gpus == 1 or j.workload_class != "small"  # multi-GPU jobs are never `small`


def test_the_cli_prepares_the_bundled_philly_trace_and_simulate_reads_it(tmp_path):
    assert traces.PHILLY.is_file(), "the Philly trace must ship in the repository"
    out = tmp_path / "jobs.csv"
    done = subprocess.run(
        [sys.executable, "-m", "whaleflux", "trace", "prepare", "-o", str(out), "--time-scale", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == COLUMNS
    assert f"{len(rows):,} jobs" in done.stdout
    assert all(float(r["duration_s"]) >= 60 for r in rows)
    assert all(r["preemptible"] == ("true" if r["priority"] == "low" else "false") for r in rows)
    assert {r["team"] for r in rows} and all(r["team"].startswith("vc-") for r in rows)  # Philly's own clusters

    # The simulator accepts what it wrote (a slice of it: the replay itself is the benchmark's business).
    head = tmp_path / "head.csv"
    head.write_text("".join(out.read_text().splitlines(keepends=True)[:301]))
    sim = subprocess.run(
        [sys.executable, "-m", "whaleflux", "simulate", "--jobs", str(head), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert '"policy": "whaleflux"' in sim.stdout


def test_a_trace_without_the_columns_of_its_format_is_refused_with_what_it_has(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,when\n1,2\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "whaleflux",
            "trace",
            "prepare",
            str(bad),
            "--format",
            "generic",
            "-o",
            str(tmp_path / "out.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no column job_id, submission_time, duration, num_gpu (has: id, when)" in done.stdout
    assert not (tmp_path / "out.csv").exists()
    wrong = subprocess.run(
        [sys.executable, "-m", "whaleflux", "trace", "prepare", str(bad), "--format", "alibaba"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and "--format 'alibaba': choose one of philly, generic" in wrong.stdout


def test_compressed_traces_read_like_plain_ones(tmp_path):
    import gzip
    import lzma

    text = "job_id,submission_time,duration,num_gpu\na,10,100,1\nb,5,200,2\n"
    plain, gz, xz = tmp_path / "t.csv", tmp_path / "t.csv.gz", tmp_path / "t.csv.xz"
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    xz.write_bytes(lzma.compress(text.encode()))
    read = [list(traces.read_trace(Path(p), "generic")) for p in (plain, gz, xz)]
    assert read[0] == read[1] == read[2] and [j.job_id for j in read[0]] == ["a", "b"]
