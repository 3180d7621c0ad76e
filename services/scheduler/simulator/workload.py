"""The generic job CSV (see shared/data/traces/README.md) read into typed jobs."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus", "team", "class", "min_vram_gb", "priority", "preemptible")


@dataclass(frozen=True)
class SimJob:
    job_id: str
    submit_time_s: float
    duration_s: float  # on A100 80GB GPUs joined by NVLink
    num_gpus: int
    team: str
    workload_class: str
    min_vram_gb: float
    priority: str
    preemptible: bool


def read_jobs(path: str | Path, time_scale: float = 1.0) -> list[SimJob]:
    """Jobs sorted by submit time; `time_scale` stretches the gaps between submissions."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        jobs = [
            SimJob(
                job_id=row["job_id"],
                submit_time_s=float(row["submit_time_s"]) * time_scale,
                duration_s=float(row["duration_s"]),
                num_gpus=int(row["num_gpus"]),
                team=row["team"],
                workload_class=row["class"],
                min_vram_gb=float(row["min_vram_gb"]),
                priority=row["priority"],
                preemptible=row["preemptible"].strip().lower() == "true",
            )
            for row in reader
        ]
    jobs.sort(key=lambda j: (j.submit_time_s, j.job_id))
    return jobs
