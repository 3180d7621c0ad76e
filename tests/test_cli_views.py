"""What the CLI prints for long work and for reports: progress of a replay, grouped notes, exit codes in words."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from whaleflux.commands.costs import group_notes
from whaleflux.commands.jobs import exit_status
from whaleflux.scheduler.simulator.run import simulate_files
from whaleflux.shared.datafiles import DATA_DIR
from whaleflux.simulate_view import WatchedJobs, simulate_with_progress
from whaleflux.traces import TraceJob, prepare, write_csv

ROOT = Path(__file__).resolve().parents[1]


def _workload(tmp_path: Path, n: int = 400) -> Path:
    jobs = [TraceJob(f"j{i}", i * 90.0, 600.0 + (i * 37) % 3000, 1 + i % 4, None) for i in range(n)]
    path = tmp_path / "jobs.csv"
    write_csv(prepare(jobs, seed=3), path)
    return path


def test_the_progress_wrapper_changes_nothing_in_the_replay(tmp_path):
    jobs, fleet = _workload(tmp_path), DATA_DIR / "fleets" / "mixed-256.yaml"
    plain = simulate_files(jobs, fleet, ["backfill", "whaleflux"])
    watched = simulate_with_progress(jobs, fleet, ["backfill", "whaleflux"], 1.0, Console(quiet=True))
    assert watched == plain


def test_watched_jobs_report_how_far_the_replay_has_read():
    jobs = WatchedJobs(range(10))
    assert jobs.reached == 0
    _ = jobs[3]
    _ = jobs[1]
    assert jobs.reached == 4 and len(jobs) == 10 and list(jobs) == list(range(10))


def test_simulate_reports_progress_on_stderr_and_keeps_stdout_for_the_answer(tmp_path):
    jobs = _workload(tmp_path)
    out = subprocess.run([sys.executable, "-m", "whaleflux", "simulate", "--jobs", str(jobs), "--policy", "fifo",
                          "--policy", "WhaleFlux", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [r["policy"] for r in json.loads(out.stdout)] == ["fifo", "whaleflux"]
    assert "fifo: 400/400 jobs submitted (100%" in out.stderr and "whaleflux: done in" in out.stderr


def test_repeated_notes_become_one_line_with_a_count():
    notes = [f"GPU-{i:08x}-0000-0000-0000-000000000000: no owned A100 price book entry at 2026-12-01" for i in range(8)]
    notes += ["GPU-ffffffff-0000-0000-0000-000000000000: no owned H100 price book entry at 2026-12-01",
              "prices are reference list prices", "prices are reference list prices"]
    grouped = group_notes(notes)
    assert len(grouped) == 3
    assert grouped[0].startswith("no owned A100 price book entry at 2026-12-01 (8 GPUs: GPU-00000000…")
    assert grouped[0].endswith("and 5 more)")
    assert grouped[1].startswith("no owned H100 price book entry at 2026-12-01 (1 GPU: ")
    assert grouped[2] == "prices are reference list prices (2 times)"


def test_exit_codes_are_told_in_words():
    assert exit_status(0) == "exit code 0" and exit_status(3) == "exit code 3"
    assert exit_status(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_status(128 + signal.SIGTERM) == "exit code 143 (128 + SIGTERM)"
    assert exit_status(None) is None


def test_schemas_check_works_from_any_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHALEFLUX_")}
    out = subprocess.run([sys.executable, "-m", "whaleflux", "schemas", "--check"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert str(ROOT / "docs" / "events") in out.stdout
