"""Load a workload and a fleet from files and simulate policies on them (the thin shell)."""

from __future__ import annotations

from pathlib import Path

from whaleflux.shared.catalog import load_fleet

from ..queueing import POLICIES
from .engine import simulate
from .fleet import fleet_nodes, interconnects, model_facts
from .metrics import SimReport
from .rules import LIVE, ExecutorRules
from .workload import SimJob, read_jobs, with_estimate_noise


def load_jobs(
    jobs_csv: str | Path, time_scale: float = 1.0, estimate_noise: float = 0.0, seed: int = 1
) -> list[SimJob]:
    """The job CSV, stretched, with seeded noise on the runtime estimates (0: as the CSV says)."""
    return with_estimate_noise(read_jobs(jobs_csv, time_scale), estimate_noise, seed)


def check_policies(policies: list[str]) -> None:
    """Refuse unknown policy names, naming the choices."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")


def simulate_files(jobs_csv: str | Path, fleet_yaml: str | Path, policies: list[str], time_scale: float = 1.0,
                   estimate_noise: float = 0.0, rules: ExecutorRules = LIVE) -> list[SimReport]:
    """Replay the job CSV on the fleet once per policy."""
    check_policies(policies)
    jobs = load_jobs(jobs_csv, time_scale, estimate_noise)
    fleet = load_fleet(fleet_yaml)
    facts, links = model_facts(), interconnects()
    return [simulate(jobs, fleet_nodes(fleet), POLICIES[p], facts, links, rules=rules) for p in policies]
