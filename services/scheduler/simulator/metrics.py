"""What a simulation reports (see shared/data/traces/README.md, "Metrics a simulator reports").

The headline capacity figure is usable-GPU busy utilization: in each second
in which a job waited, of the GPUs some waiting job could use (model allowed,
memory fits), the share held. Busy utilization over every GPU is kept as a
secondary figure: a GPU that no waiting job can use stays idle under any
policy that respects memory and model needs, so that figure punishes the
right decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobOutcome:
    """One job of a replay, start to end (`whaleflux simulate --jobs-out` writes one row per job)."""

    job_id: str
    team: str
    workload_class: str
    gpus: int
    min_vram_gb: float
    priority: str
    duration_s: float  # on A100, as the trace says
    submit_s: float
    first_start_s: float | None  # None: never started
    finish_s: float | None  # None: never finished (rejected, or could never start)
    run_s: float  # seconds its attempts held GPUs
    moves: int
    preemptions: int
    models: tuple[str, ...]  # GPU models it ran on, in order of first use
    rejected: str | None = None

    @property
    def jct_s(self) -> float | None:
        """Completion time: finish - submit."""
        return None if self.finish_s is None else self.finish_s - self.submit_s

    @property
    def wait_s(self) -> float | None:
        """Queueing delay: first start - submit."""
        return None if self.first_start_s is None else self.first_start_s - self.submit_s

    @property
    def pending_s(self) -> float | None:
        """Every second it did not run between submission and its end (first wait, after stops, held)."""
        jct = self.jct_s
        return None if jct is None else max(0.0, jct - self.run_s)


@dataclass(frozen=True)
class TeamReport:
    team: str
    jobs: int
    gpu_seconds: float
    share: float  # of all allocated GPU-seconds
    mean_slowdown: float  # JCT / duration on A100


@dataclass(frozen=True)
class SimReport:
    policy: str
    jobs: int
    finished: int
    rejected: int
    mean_jct_s: float
    p50_jct_s: float
    p99_jct_s: float
    mean_queueing_s: float
    makespan_s: float
    utilization: float
    # The headline: GPUs some waiting job could use, held, while jobs waited.
    busy_utilization_usable: float
    # Secondary: every GPU of the fleet held while jobs waited.
    busy_utilization: float
    preemptions: int
    backfilled: int
    migrations: int = 0
    teams: list[TeamReport] = field(default_factory=list)
    rejections: dict[str, str] = field(default_factory=dict)
    # GPU memory sizes of the fleet (GB, ascending): the memory tiers of the per-class table.
    memory_tiers_gb: tuple[float, ...] = ()
    # Every job's outcome (for --jobs-out and the per-class table); left out of comparisons.
    outcomes: tuple[JobOutcome, ...] = field(default=(), repr=False, compare=False)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


ROWS: tuple[tuple[str, Callable[[SimReport], str]], ...] = (
    ("jobs", lambda r: f"{r.jobs}"),
    ("finished / rejected", lambda r: f"{r.finished} / {r.rejected}"),
    ("mean JCT (h)", lambda r: f"{r.mean_jct_s / 3600:.2f}"),
    ("p50 JCT (h)", lambda r: f"{r.p50_jct_s / 3600:.2f}"),
    ("p99 JCT (h)", lambda r: f"{r.p99_jct_s / 3600:.1f}"),
    ("busy utilization, usable GPUs", lambda r: f"{r.busy_utilization_usable:.3f}"),
    ("mean queueing (h)", lambda r: f"{r.mean_queueing_s / 3600:.2f}"),
    ("makespan (d)", lambda r: f"{r.makespan_s / 86400:.1f}"),
    ("utilization", lambda r: f"{r.utilization:.3f}"),
    ("busy utilization, all GPUs", lambda r: f"{r.busy_utilization:.3f}"),
    ("preemptions", lambda r: f"{r.preemptions}"),
    ("backfilled starts", lambda r: f"{r.backfilled}"),
    ("moves of running jobs", lambda r: f"{r.migrations}"),
)


def side_by_side(reports: Sequence[SimReport]) -> list[list[str]]:
    """One row per metric, one column per policy (header row first)."""
    rows = [["metric", *(r.policy for r in reports)]]
    rows += [[label, *(fmt(r) for r in reports)] for label, fmt in ROWS]
    return rows


def team_rows(report: SimReport) -> list[list[str]]:
    """Per team: jobs, share of GPU-seconds, mean slowdown."""
    return [[t.team, str(t.jobs), f"{t.share:.3f}", f"{t.mean_slowdown:.2f}"] for t in report.teams]
