"""A replay's job outcomes and usage integrals turned into its `SimReport`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .metrics import JobOutcome, SimReport, TeamReport, percentile
from .usage import Usage


@dataclass(frozen=True)
class Counts:
    preemptions: int
    backfilled: int
    migrations: int


def team_reports(outcomes: Sequence[JobOutcome], gpu_s_by_team: Mapping[str, float]) -> list[TeamReport]:
    """Per team: finished jobs, share of allocated GPU-seconds, mean slowdown (JCT / A100 duration)."""
    slowdowns: dict[str, list[float]] = defaultdict(list)
    for o in outcomes:
        if o.finish_s is not None:
            slowdowns[o.team].append((o.finish_s - o.submit_s) / max(1.0, o.duration_s))
    total = sum(gpu_s_by_team.values()) or 1.0
    return [
        TeamReport(team, len(slowdowns[team]), gpu_s_by_team.get(team, 0.0), gpu_s_by_team.get(team, 0.0) / total,
                   sum(slowdowns[team]) / len(slowdowns[team]) if slowdowns[team] else 0.0)
        for team in sorted(set(gpu_s_by_team) | set(slowdowns))
    ]


def build_report(name: str, outcomes: Sequence[JobOutcome], usage: Usage, gpu_s_by_team: Mapping[str, float],
                 counts: Counts, t0: float, tiers_gb: tuple[float, ...]) -> SimReport:
    """The report of one replay."""
    done = [o for o in outcomes if o.finish_s is not None]
    jct = sorted(o.finish_s - o.submit_s for o in done if o.finish_s is not None)
    queueing = [o.first_start_s - o.submit_s for o in done if o.first_start_s is not None]
    makespan = (max(o.finish_s for o in done if o.finish_s is not None) - t0) if done else 0.0
    rejected = {o.job_id: o.rejected for o in outcomes if o.rejected is not None}
    fleet = usage.cluster.total_gpus
    return SimReport(
        policy=name,
        jobs=len(outcomes),
        finished=len(done),
        rejected=len(rejected),
        mean_jct_s=sum(jct) / len(jct) if jct else 0.0,
        p50_jct_s=percentile(jct, 50),
        p99_jct_s=percentile(jct, 99),
        mean_queueing_s=sum(queueing) / len(queueing) if queueing else 0.0,
        makespan_s=makespan,
        utilization=usage.alloc_gpu_s / (fleet * makespan) if makespan and fleet else 0.0,
        busy_utilization_usable=usage.busy_usable,
        busy_utilization=usage.busy,
        preemptions=counts.preemptions,
        backfilled=counts.backfilled,
        migrations=counts.migrations,
        teams=team_reports(outcomes, gpu_s_by_team),
        rejections=dict(list(rejected.items())[:20]),
        memory_tiers_gb=tiers_gb,
        outcomes=tuple(outcomes),
    )
