"""The queue policy's inputs: waiting and running jobs, team quotas, policy configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..placement import FIRST_FIT, JobRequest, Profile

# Lower rank runs first.
PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


def rank(priority: str) -> int:
    """Rank of a priority class (unknown classes count as normal)."""
    return PRIORITY_RANK.get(priority, 1)


@dataclass(frozen=True)
class PendingJob:
    request: JobRequest
    submit_time: float
    seq: int = 0  # ties between equal submit times, in arrival order
    preemptions: int = 0  # times it was preempted so far
    # It resumes from a checkpoint of its own when stopped: once it runs on one node, the policy may move it.
    checkpointable: bool = False

    @property
    def job_id(self) -> str:
        return self.request.job_id


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    team: str
    priority: str
    preemptible: bool
    gpus: int
    started_at: float
    # The policy's estimate of when it ends; None when the job gave no runtime.
    expected_end: float | None = None
    preemptions: int = 0
    # Without an estimate: when to assume it ends for a backfill reservation only (from its workload
    # class; None: it may run indefinitely, e.g. a service). Never used to move or preempt it.
    assumed_end: float | None = None
    # For migration to faster GPUs (None/False: the job is never moved): what it asked for
    # (its expected_runtime_s is not used; `expected_end` is), the speed of the placement
    # it runs on, whether it resumes from a checkpoint, and how often it was moved.
    request: JobRequest | None = None
    speed: float | None = None
    checkpointable: bool = False
    migrations: int = 0


def estimate_left(estimate: float | None, placed_at: float, expected_end: float | None, now: float) -> float | None:
    """A stopped job's estimate (A100 s) less the share of its attempt's expected length that ran until `now`
    (the attempt was placed at `placed_at` to end at `expected_end`); at least 1 s; unknown: `estimate`."""
    if estimate is None or expected_end is None or expected_end <= placed_at:
        return estimate
    return max(1.0, estimate * (1.0 - (now - placed_at) / (expected_end - placed_at)))


@dataclass(frozen=True)
class TeamPolicy:
    """GPUs guaranteed to a team (None: no quota) and its weight in fair share."""

    quota_gpus: int | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    profile: Profile = field(default_factory=Profile)
    use_priorities: bool = True
    fair_share: bool = True
    backfill: bool = True
    preemption: bool = True
    # Estimates divide the A100 runtime by the placement's speed (model-aware);
    # the baselines take the job's A100 runtime as it is.
    estimates_scale_with_speed: bool = True
    # Bounds on one pass (like Slurm's bf_max_job_test): jobs examined, and
    # jobs examined in a row without placing one.
    scan_depth: int = 2000
    max_misses_in_a_row: int = 300
    # Priority classes that may preempt lower, preemptible classes.
    preempt_for: frozenset[str] = frozenset({"high"})
    min_run_before_preemption_s: float = 600.0
    max_preemptions_per_job: int = 3
    # Migration to faster GPUs (migration.py): a running checkpointable job moves to free GPUs of a
    # faster model when its remaining time drops by at least `migrate_min_gain_s` (None: never moves)
    # and to at most `migrate_max_ratio` of what it is, counting `migration_overhead_s` for the restart.
    migrate_min_gain_s: float | None = 600.0
    migrate_max_ratio: float = 0.85
    migration_overhead_s: float = 60.0
    max_migrations_per_job: int = 4
    # Moves (up and out of the way) never put a job that fits a smaller GPU on the largest-memory
    # model: those GPUs are the only ones the largest jobs can use.
    migrate_spares_largest_memory: bool = True
    # New placements keep a job that fits a smaller GPU off the largest-memory model while a job that
    # needs that memory waits (unless the job itself has waited past the aging bound). Off: a gang that
    # waits days for every H200 then keeps them idle (Philly seed 3, bench/RESULTS.md).
    spare_largest_memory_while_needed: bool = False
    # New placements keep a job that fits a smaller GPU and could not be moved once started (no checkpoint, or a
    # gang over nodes) off the largest-memory model when its estimate is longer than this (or unknown; None: no
    # such rule), unless it has waited past the aging bound: no move could take it off those GPUs again, so it
    # would keep them from the jobs only they can hold for all of its run (Philly seed 3: a 655-hour job that
    # fits 80 GB kept a 32-GPU gang of 83 GB waiting 27 h longer than under backfill, bench/RESULTS.md).
    unmovable_on_largest_max_s: float | None = None
    # The first blocked job may have running checkpointable jobs moved off GPUs it needs to free GPUs
    # elsewhere, when the time they lose (GPU-seconds) is at most `make_room_budget` x its wait x its GPUs.
    make_room_by_migration: bool = True
    make_room_budget: float = 12.0
    # Within a class and team, the least work (expected runtime x GPUs) first, instead of oldest first.
    shortest_first: bool = False
    # Aging: a job waiting this long comes before every job that has not, oldest first, whatever its
    # priority class or team (None: never), so its wait is bounded as under FIFO with backfill.
    aging_s: float | None = None
    # Reservations in one pass: the head's, then one for each blocked job past the aging bound.
    max_reservations: int = 8
    # Shortest remaining first: the first blocked job, when its estimate is at most `preempt_shorter_max_s`
    # (None: never), may stop running jobs of no higher class that keep a checkpoint and have at least
    # `preempt_shorter_ratio` x its estimate left (they resume later with their work; same guards as above).
    preempt_shorter_max_s: float | None = None
    preempt_shorter_ratio: float = 2.0
    # Shortest remaining first for every blocked job of at most that estimate, not only the first: each
    # later one stops jobs only on nodes no reservation of the pass counts on, and starts within them.
    preempt_shorter_every_blocked: bool = False
    # Victim searches for blocked jobs after the head in one pass (each walks the running jobs that may be
    # stopped; the head's is not counted; None: no bound), as Slurm bounds the jobs one backfill pass tests:
    # on 1,000 busy nodes an unbounded pass took up to 6 s (bench/RESULTS.md, issue 14, eighth pass).
    max_preemption_searches: int | None = 8
    # Score weights that replace the profile's for a job that keeps no checkpoint: no move can take it to a
    # faster GPU once it runs, so its first placement is the one it keeps.
    pinned_weights: Mapping[str, float] = field(default_factory=dict)

    def profile_for(self, job: PendingJob) -> Profile:
        """How the job is placed: with `pinned_weights` over the profile's when it keeps no checkpoint."""
        return self.profile if job.checkpointable or not self.pinned_weights else self._pinned_profile

    @cached_property
    def _pinned_profile(self) -> Profile:
        return replace(self.profile, weights={**self.profile.weights, **self.pinned_weights})


FIFO = PolicyConfig(
    name="fifo", profile=FIRST_FIT, use_priorities=False, fair_share=False, backfill=False,
    preemption=False, estimates_scale_with_speed=False, migrate_min_gain_s=None, make_room_by_migration=False,
)
BACKFILL = PolicyConfig(
    name="backfill", profile=FIRST_FIT, use_priorities=False, fair_share=False, backfill=True,
    preemption=False, estimates_scale_with_speed=False, migrate_min_gain_s=None, make_room_by_migration=False,
)
# The default: every mechanism, waits bounded by aging after 4 h, shortest remaining first for every blocked job
# of up to a day (gangs included) with up to 6 stops per job, long jobs that could not be moved kept off the
# largest-memory GPUs, and a job that keeps no checkpoint placed by speed (weight 10, not 6), not by comparative
# advantage or best fit: its first placement is the one it keeps (bench/RESULTS.md, issue 14).
WHALEFLUX = PolicyConfig(name="whaleflux", aging_s=4 * 3600.0, preempt_shorter_max_s=24 * 3600.0,
                         preempt_shorter_every_blocked=True, unmovable_on_largest_max_s=4 * 3600.0,
                         max_preemptions_per_job=6,
                         pinned_weights={"comparative_advantage": 0.0, "best_fit": 0.0, "speed": 10.0})
POLICIES = {p.name: p for p in (FIFO, BACKFILL, WHALEFLUX)}
