"""The generic job CSV (see shared/data/traces/README.md) read into typed jobs.

Two optional columns carry what the live service would be told by the job's
spec: `expected_runtime_s` (the runtime estimate the policy sees; absent or
empty: the true duration) and `checkpoint` (`true`: the job keeps its own
checkpoint, so it may be moved; absent or empty: a training job, `llm-train`
or `finetune`, or a preemptible one does). `with_estimate_noise` gives every
job an estimate off its true runtime by a seeded log-normal factor instead.
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist

COLUMNS = (
    "job_id", "submit_time_s", "duration_s", "num_gpus", "team", "class", "min_vram_gb", "priority", "preemptible",
)
# Classes whose jobs write checkpoints of their own (training) when the trace does not say.
CHECKPOINTING_CLASSES = frozenset({"llm-train", "finetune"})


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
    # What the job tells the scheduler it needs (A100 seconds); None: its true duration.
    estimate_s: float | None = None
    # Keeps its own checkpoint (may be moved, like a live job with `checkpoint_dir`); None: by class.
    checkpoint: bool | None = None

    @property
    def expected_runtime_s(self) -> float:
        """The runtime estimate the policy sees (A100 seconds)."""
        return self.duration_s if self.estimate_s is None else self.estimate_s

    @property
    def keeps_checkpoint(self) -> bool:
        """Whether a stop keeps its work: it resumes from a checkpoint (preemptible jobs accept stops)."""
        if self.checkpoint is not None:
            return self.checkpoint or self.preemptible
        return self.preemptible or self.workload_class in CHECKPOINTING_CLASSES


def _flag(text: str | None) -> bool | None:
    text = (text or "").strip().lower()
    return None if not text else text == "true"


def _row_job(row: dict[str, str], time_scale: float) -> SimJob:
    estimate = (row.get("expected_runtime_s") or "").strip()
    return SimJob(
        job_id=row["job_id"],
        submit_time_s=float(row["submit_time_s"]) * time_scale,
        duration_s=float(row["duration_s"]),
        num_gpus=int(row["num_gpus"]),
        team=row["team"],
        workload_class=row["class"],
        min_vram_gb=float(row["min_vram_gb"]),
        priority=row["priority"],
        preemptible=_flag(row["preemptible"]) is True,
        estimate_s=float(estimate) if estimate else None,
        checkpoint=_flag(row.get("checkpoint")),
    )


def read_jobs(path: str | Path, time_scale: float = 1.0) -> list[SimJob]:
    """Jobs sorted by submit time; `time_scale` stretches the gaps between submissions."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        jobs = []
        for row in reader:
            try:
                jobs.append(_row_job(row, time_scale))
            except ValueError as exc:
                raise ValueError(f"{path}:{reader.line_num}: {exc}") from None
    jobs.sort(key=lambda j: (j.submit_time_s, j.job_id))
    return jobs


def _normal(seed: int, job_id: str) -> float:
    """A standard normal number fixed by seed and job."""
    digest = hashlib.sha256(f"{seed}:{job_id}:estimate".encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    return NormalDist().inv_cdf(u)


def with_estimate_noise(jobs: list[SimJob], sigma: float, seed: int = 1) -> list[SimJob]:
    """Each job's estimate = its duration x exp(N(0, sigma)), fixed by seed and job id (sigma 0: exact)."""
    if sigma < 0:
        raise ValueError(f"estimate noise must be >= 0, got {sigma}")
    if sigma == 0:
        return list(jobs)
    return [replace(j, estimate_s=j.duration_s * math.exp(sigma * _normal(seed, j.job_id))) for j in jobs]
