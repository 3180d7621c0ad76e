"""From a public GPU-cluster job trace to the generic job CSV the scheduler simulator replays.

Public traces give submit time, duration and GPU count, not what the job is.
`prepare` fills in the rest deterministically from a seed (the same seed always
gives the same workload): team (the trace's virtual cluster where it has one,
else drawn), workload class, per-GPU memory and priority (`low` jobs are
preemptible). `duration_s` is read as the job's run time on A100 80GB GPUs on
one NVLink node; the simulator scales it by the speed of the GPUs it gets.

The method is that of `prepare_trace.py` in the project's shared tools (see
shared/data/traces/README.md); the one difference is that Philly's timestamps
are read as UTC, so the output does not depend on the machine's time zone.
Standard library only, so `whaleflux trace prepare` starts fast.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import lzma
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import whaleflux.shared  # a docstring only: cheap

TRACES_DIR = Path(whaleflux.shared.__file__).resolve().parent / "data" / "traces"
PHILLY = TRACES_DIR / "philly.csv.xz"
FORMATS = ("philly", "generic")

CLASSES_SINGLE = [("small", 0.35), ("finetune", 0.30), ("inference", 0.20), ("llm-train", 0.15)]
CLASSES_MULTI = [("llm-train", 0.60), ("finetune", 0.30), ("inference", 0.10)]
VRAM_RANGE_GB = {"small": (4, 20), "finetune": (16, 72), "inference": (8, 96), "llm-train": (30, 78)}
PRIORITIES = [("high", 0.10), ("normal", 0.70), ("low", 0.20)]
DRAWN_TEAMS = [("team-a", 0.30), ("team-b", 0.20), ("team-c", 0.15), ("team-d", 0.10),
               ("team-e", 0.10), ("team-f", 0.07), ("team-g", 0.05), ("team-h", 0.03)]
COLUMNS = ["job_id", "submit_time_s", "duration_s", "num_gpus", "team", "class",
           "min_vram_gb", "priority", "preemptible"]


class TraceError(ValueError):
    """A trace that cannot be read: missing column, bad value (with its line)."""


@dataclass(frozen=True)
class TraceJob:
    """One job as a trace records it."""

    job_id: str
    submit_s: float  # absolute, seconds
    duration_s: float
    gpus: int
    team: str | None  # the trace's own team (Philly's virtual cluster), if it has one


@dataclass(frozen=True)
class WorkloadJob:
    """One row of the generic job CSV."""

    job_id: str
    submit_time_s: float
    duration_s: float
    num_gpus: int
    team: str
    workload_class: str
    min_vram_gb: int
    priority: str

    def row(self) -> list[str]:
        return [self.job_id, f"{self.submit_time_s:.0f}", f"{self.duration_s:.0f}", str(self.num_gpus), self.team,
                self.workload_class, str(self.min_vram_gb), self.priority,
                "true" if self.priority == "low" else "false"]


def open_text(path: Path) -> io.TextIOBase:
    """A trace file as text, plain or compressed (.xz, .gz)."""
    if path.suffix == ".xz":
        return lzma.open(path, "rt", newline="")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def _rows(path: Path, needed: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with open_text(path) as f:
        reader = csv.DictReader(f)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: no column {', '.join(missing)} (has: {', '.join(reader.fieldnames or [])})")
        for row in reader:
            yield reader.line_num, row


def read_philly(path: Path) -> Iterator[TraceJob]:
    """Philly extract: timestamp,duration,num_gpus,gpu_time,cluster (rows in any order)."""
    for n, (line, row) in enumerate(_rows(path, ("timestamp", "duration", "num_gpus", "cluster"))):
        try:
            submit = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            yield TraceJob(f"philly-{n:06d}", submit.timestamp(), float(row["duration"]), int(row["num_gpus"]),
                           f"vc-{row['cluster']}")
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None


def read_generic(path: Path) -> Iterator[TraceJob]:
    """Generic trace: job_id,submission_time,duration,num_gpu."""
    for line, row in _rows(path, ("job_id", "submission_time", "duration", "num_gpu")):
        try:
            yield TraceJob(row["job_id"], float(row["submission_time"]), float(row["duration"]), int(row["num_gpu"]),
                           None)
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from None


def uniform(seed: int, job_id: str, field: str) -> float:
    """A number in [0, 1) fixed by seed, job and field."""
    digest = hashlib.sha256(f"{seed}:{job_id}:{field}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick(weighted: list[tuple[str, float]], u: float) -> str:
    acc = 0.0
    for value, weight in weighted:
        acc += weight
        if u < acc:
            return value
    return weighted[-1][0]


def prepare(jobs: Iterable[TraceJob], seed: int = 1, time_scale: float = 1.0, min_duration_s: float = 60.0,
            max_gpu_hours: float = 1000.0) -> list[WorkloadJob]:
    """Filter, sort by submission, make times relative to the first job (gaps times `time_scale`), fill in the rest."""
    kept = [j for j in jobs if j.duration_s >= min_duration_s and j.duration_s * j.gpus / 3600 <= max_gpu_hours]
    kept.sort(key=lambda j: (j.submit_s, j.job_id))
    if not kept:
        return []
    t0 = kept[0].submit_s
    out = []
    for j in kept:
        klass = pick(CLASSES_SINGLE if j.gpus == 1 else CLASSES_MULTI, uniform(seed, j.job_id, "class"))
        lo, hi = VRAM_RANGE_GB[klass]
        out.append(WorkloadJob(
            job_id=j.job_id, submit_time_s=(j.submit_s - t0) * time_scale, duration_s=j.duration_s, num_gpus=j.gpus,
            team=j.team or pick(DRAWN_TEAMS, uniform(seed, j.job_id, "team")), workload_class=klass,
            min_vram_gb=round(lo + (hi - lo) * uniform(seed, j.job_id, "vram")),
            priority=pick(PRIORITIES, uniform(seed, j.job_id, "priority")),
        ))
    return out


def write_csv(jobs: list[WorkloadJob], path: Path) -> None:
    """Write the generic job CSV (a temporary file renamed into place: never half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(j.row() for j in jobs)
    tmp.replace(path)


def read_trace(path: Path, fmt: str) -> Iterator[TraceJob]:
    return read_philly(path) if fmt == "philly" else read_generic(path)
