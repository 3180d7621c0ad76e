"""What a simulation reports (see shared/data/traces/README.md, "Metrics a simulator reports")."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    busy_utilization: float
    # Secondary: counting in each waiting second only the GPUs some waiting job could use (model
    # allowed, memory fits), the share of them held. Not the headline figure.
    busy_utilization_usable: float
    # The README's formula read literally: all allocated GPU-seconds over (fleet x waiting seconds).
    busy_utilization_literal: float
    preemptions: int
    backfilled: int
    migrations: int = 0
    teams: list[TeamReport] = field(default_factory=list)
    rejections: dict[str, str] = field(default_factory=dict)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


ROWS = (
    ("jobs", lambda r: f"{r.jobs}"),
    ("finished / rejected", lambda r: f"{r.finished} / {r.rejected}"),
    ("mean JCT (h)", lambda r: f"{r.mean_jct_s / 3600:.2f}"),
    ("p50 JCT (h)", lambda r: f"{r.p50_jct_s / 3600:.2f}"),
    ("p99 JCT (h)", lambda r: f"{r.p99_jct_s / 3600:.1f}"),
    ("mean queueing (h)", lambda r: f"{r.mean_queueing_s / 3600:.2f}"),
    ("makespan (d)", lambda r: f"{r.makespan_s / 86400:.1f}"),
    ("utilization", lambda r: f"{r.utilization:.3f}"),
    ("busy utilization", lambda r: f"{r.busy_utilization:.3f}"),
    ("busy utilization (usable GPUs only)", lambda r: f"{r.busy_utilization_usable:.3f}"),
    ("busy utilization (literal)", lambda r: f"{r.busy_utilization_literal:.3f}"),
    ("preemptions", lambda r: f"{r.preemptions}"),
    ("backfilled starts", lambda r: f"{r.backfilled}"),
    ("migrations (moves of running jobs)", lambda r: f"{r.migrations}"),
)


def side_by_side(reports: list[SimReport]) -> list[list[str]]:
    """One row per metric, one column per policy (header row first)."""
    rows = [["metric", *(r.policy for r in reports)]]
    rows += [[label, *(fmt(r) for r in reports)] for label, fmt in ROWS]
    return rows


def team_rows(report: SimReport) -> list[list[str]]:
    """Per team: jobs, share of GPU-seconds, mean slowdown."""
    return [[t.team, str(t.jobs), f"{t.share:.3f}", f"{t.mean_slowdown:.2f}"] for t in report.teams]
