"""What the CLI prints for long work and for reports: progress of a replay, grouped notes, exit codes in words,
the fleet identity of `costs`, the lease days of `leases`; and who `up` and compose tell each service to ask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import yaml
from rich.console import Console

from whaleflux.commands.costs import fleet_identity, group_notes
from whaleflux.commands.inventory import lease_days
from whaleflux.commands.jobs import exit_status
from whaleflux.local import SERVICE_LINKS, linked_env
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


def _terms(line: str) -> tuple[Decimal, Decimal]:
    """(fleet, signed sum of the terms) of a "fleet $F = a $x + b $y - c $z" line."""
    fleet, rhs = line.split(" = ")
    total, sign = Decimal(0), 1
    for word in rhs.split():
        if word in ("+", "-"):
            sign = 1 if word == "+" else -1
        elif word.startswith("$"):
            total += sign * Decimal(word[1:])
    return Decimal(fleet.split("$")[1]), total


def test_costs_prints_the_fleet_identity_as_billing_adds_it_up():
    # Totals as billing's report gives them: fleet = allocated + running + idle + rounding.
    totals = {"fleet_usd": "1000.00", "allocated_usd": "612.34", "idle_usd": "300.01", "unshared_idle_usd": "300.01",
              "running_usd": "87.66", "rounding_usd": "-0.01", "share_idle": False, "running_as_rows": False}
    line = fleet_identity(totals, share_idle=False)
    assert line == "fleet $1000.00 = allocated $612.34 + idle $300.01 + running $87.66 - rounding $0.01"
    assert _terms(line) == (Decimal("1000.00"), Decimal("1000.00"))


def test_costs_identity_shared_back_splits_idle_into_shares_and_the_unshared_rest():
    totals = {"fleet_usd": "1000.00", "allocated_usd": "700.00", "idle_usd": "299.99", "unshared_idle_usd": "20.00",
              "running_usd": "0.00", "rounding_usd": "0.01", "share_idle": True, "running_as_rows": True}
    line = fleet_identity(totals, share_idle=True)
    assert line == ("fleet $1000.00 = allocated $700.00 + idle shared back $279.99 + idle not shared $20.00"
                    " + rounding $0.01")  # running jobs are rows: no running line
    assert _terms(line) == (Decimal("1000.00"), Decimal("1000.00"))
    # Running as its own line is shown even when it is zero, so the identity names every term of the report.
    assert "+ running $0.00 +" in fleet_identity({**totals, "running_as_rows": False}, share_idle=True)


def test_leases_show_the_last_day_covered_and_the_last_day_to_give_notice():
    row = {"ends_at": "2027-05-01T00:00:00Z", "covered_through": "2027-04-30",
           "notice_deadline": "2027-04-01T00:00:00Z", "notice_by": "2027-03-31"}
    assert lease_days(row) == ("2027-04-30", "2027-03-31")
    # An inventory without the new fields: the day before each exclusive midnight, not the midnight's own day.
    older = {"ends_at": "2027-05-01T00:00:00+00:00", "notice_deadline": "2027-04-01T00:00:00Z"}
    assert lease_days(older) == ("2027-04-30", "2027-03-31")
    assert lease_days({"ends_at": "2027-05-01T00:00:00Z", "notice_deadline": None}) == ("2027-04-30", "")


def test_up_and_compose_point_inventory_at_billing_and_the_others_at_inventory():
    services = {n: f"http://127.0.0.1:{8700 + i}" for i, n in
                enumerate(("telemetry", "scheduler", "alerting", "billing", "inventory"), 1)}
    assert linked_env("inventory", services) == {"WHALEFLUX_BILLING_URL": services["billing"]}
    assert linked_env("billing", services) == {"WHALEFLUX_INVENTORY_URL": services["inventory"]}
    assert linked_env("telemetry", services) == {}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, peers in SERVICE_LINKS.items():
        env = compose[name]["environment"]
        for peer in peers:
            assert env[f"WHALEFLUX_{peer.upper()}_URL"] == f"http://{peer}:8000", (name, peer)
