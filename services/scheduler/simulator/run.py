"""Load a workload and a fleet from files and simulate policies on them (the thin shell)."""

from __future__ import annotations

from pathlib import Path

from whaleflux.shared.catalog import load_fleet

from ..queueing import POLICIES
from .engine import simulate
from .fleet import fleet_nodes, interconnects, model_facts
from .metrics import SimReport
from .workload import read_jobs


def simulate_files(jobs_csv: str | Path, fleet_yaml: str | Path, policies: list[str], time_scale: float = 1.0) -> list[SimReport]:
    """Replay the job CSV on the fleet once per policy."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    jobs = read_jobs(jobs_csv, time_scale)
    fleet = load_fleet(fleet_yaml)
    facts, links = model_facts(), interconnects()
    return [simulate(jobs, fleet_nodes(fleet), POLICIES[p], facts, links) for p in policies]
