"""Preemption: make room for a waiting job by stopping whole lower-priority preemptible jobs.

Victims are only jobs of a strictly lower priority class (for classes allowed
to preempt), or jobs of a team running above its quota when the waiting job's
team is below its own (reclaiming lent capacity). Neither can turn around:
a victim never outranks its preemptor, and a team within its quota is never
reclaimed from, so there are no preemption loops. A job that ran less than
`min_run_before_preemption_s`, or was preempted `max_preemptions_per_job`
times, is left alone so no job starves by repeated preemption.

Shortest remaining first (`PolicyConfig.preempt_shorter_max_s`): a job of at
most that estimate may also stop a job of no higher class that keeps a
checkpoint (it resumes with its work) and has at least
`preempt_shorter_ratio` x the job's estimate left. It cannot turn around
either: the victim has at least twice the work left of its preemptor.

Victims are whole jobs on one node each. A job that fits one node stops
victims on one node; a gang (larger than any node it may use) stops victims
on nodes of one model within one cluster and pool, as many as it needs with
the GPUs free there, so a short gang does not wait days with all but one of
its GPUs idle for a long job that could resume elsewhere later.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..placement import ClusterState, NodeShare
from ..placement.cluster import StaticView
from ..placement.framework import eligible, gang_group, unavailable, usable
from .jobs import PendingJob, PolicyConfig, RunningJob, TeamPolicy, rank
from .running import RunningJobs


@dataclass(frozen=True)
class Preemption:
    victim: str
    for_job: str
    reason: str


def victim_reason(
    job: PendingJob,
    victim: RunningJob,
    usage: Mapping[str, int],
    teams: Mapping[str, TeamPolicy],
    config: PolicyConfig,
    now: float,
) -> str | None:
    """Why `victim` may be preempted for `job`, or None if it may not."""
    if not guards_allow(victim, config, now):
        return None
    req = job.request
    if not victim.preemptible:
        return _longer(job, victim, config, now)
    if req.priority in config.preempt_for and rank(victim.priority) > rank(req.priority):
        return f"{victim.priority} priority, preempted for {req.priority} job {req.job_id}"
    mine, theirs = teams.get(req.team), teams.get(victim.team)
    if (
        victim.team != req.team
        and mine is not None and mine.quota_gpus is not None
        and usage.get(req.team, 0) + req.gpus <= mine.quota_gpus
        and theirs is not None and theirs.quota_gpus is not None
        and usage.get(victim.team, 0) > theirs.quota_gpus
    ):
        return f"team {victim.team} borrows above its quota; team {req.team} reclaims it for job {req.job_id}"
    return _longer(job, victim, config, now)


def guards_allow(victim: RunningJob, config: PolicyConfig, now: float) -> bool:
    """The victim ran long enough and was not preempted too often (so no job starves by repeated stops)."""
    return (victim.preemptions < config.max_preemptions_per_job
            and now - victim.started_at >= config.min_run_before_preemption_s)


@dataclass(frozen=True)
class Stoppable:
    """What a victim among the running jobs could be, found once per pass: the most time left of one that keeps a
    checkpoint (shortest remaining first) and the lowest class (highest rank) of a preemptible one (-1: none);
    the guards hold for both."""

    most_left: float
    lowest_rank: int

    @classmethod
    def among(cls, running: Mapping[str, RunningJob], config: PolicyConfig, now: float) -> Stoppable:
        most_left, lowest = 0.0, -1
        for r in (running.stoppable if isinstance(running, RunningJobs) else running).values():
            if not guards_allow(r, config, now):
                continue
            if r.checkpointable and r.expected_end is not None:
                most_left = max(most_left, r.expected_end - now)
            if r.preemptible:
                lowest = max(lowest, rank(r.priority))
        return cls(most_left, lowest)

    @property
    def none(self) -> bool:
        return self.most_left <= 0 and self.lowest_rank < 0

    def may_have_victims_for(self, job: PendingJob, config: PolicyConfig) -> bool:
        """False when no running job could be `job`'s victim by class or as a longer job (teams' quotas aside)."""
        req = job.request
        return ((req.priority in config.preempt_for and self.lowest_rank > rank(req.priority))
                or (shorter(job, config)
                    and self.most_left >= config.preempt_shorter_ratio * (req.expected_runtime_s or 0.0)))


def shorter(job: PendingJob, config: PolicyConfig) -> bool:
    """Whether the job is short enough to stop longer jobs (shortest remaining first)."""
    limit, runtime = config.preempt_shorter_max_s, job.request.expected_runtime_s
    return limit is not None and runtime is not None and 0 < runtime <= limit


def _longer(job: PendingJob, victim: RunningJob, config: PolicyConfig, now: float) -> str | None:
    """Why `victim` may be stopped for the shorter `job` (shortest remaining first), or None."""
    runtime = job.request.expected_runtime_s
    if (not victim.checkpointable or victim.expected_end is None or runtime is None or not shorter(job, config)
            or rank(victim.priority) < rank(job.request.priority)):
        return None
    left = victim.expected_end - now
    if left < config.preempt_shorter_ratio * runtime:
        return None
    return f"{left / 3600:.1f} h left, stopped for the shorter job {job.job_id} ({runtime / 3600:.1f} h)"


def choose_victims(
    cluster: ClusterState,
    job: PendingJob,
    running: Mapping[str, RunningJob],
    usage: Mapping[str, int],
    teams: Mapping[str, TeamPolicy],
    config: PolicyConfig,
    now: float,
    avoid: Mapping[str, int] | None = None,
) -> list[Preemption] | None:
    """The fewest GPUs of victims that let the job start: on one node for a job that fits one, on nodes of one
    model within one cluster and pool for a gang (never on a node of `avoid`: nodes a reservation counts on);
    None if impossible."""
    req = job.request
    view = eligible(cluster, req, config.profile)
    by_node: dict[str, list[tuple[RunningJob, int]]] = {}
    for r, share in _candidates(cluster, job, view, running, usage, teams, config, now, avoid):
        by_node.setdefault(share.node, []).append((r, cluster.freeable(share)))
    if req.gpus > view.max_gpus_per_node:
        return _for_gang(cluster, job, view, by_node, usage, teams, config, now, avoid)
    best: tuple[tuple[int, int, int], list[Preemption]] | None = None
    for node, victims in by_node.items():
        if unavailable(cluster, req, cluster.nodes[node], config.profile, now):
            continue
        chosen = _fewest(job, len(usable(cluster, req, node)), victims, usage, teams, config, now)
        if chosen is None:
            continue
        cost = (chosen[1], len(chosen[0]), cluster.order[node])
        if best is None or cost < best[0]:
            best = (cost, chosen[0])
    return best[1] if best else None


def _candidates(
    cluster: ClusterState, job: PendingJob, view: StaticView, running: Mapping[str, RunningJob],
    usage: Mapping[str, int], teams: Mapping[str, TeamPolicy], config: PolicyConfig, now: float,
    avoid: Mapping[str, int] | None,
) -> Iterator[tuple[RunningJob, NodeShare]]:
    """Every running job that may be stopped for `job`, on one node the job may use (not one of `avoid`), with
    its share of that node."""
    req = job.request
    longer = shorter(job, config)  # jobs that keep a checkpoint are victims too
    candidates = running
    if isinstance(running, RunningJobs):
        candidates = running.stoppable if longer else running.preemptible
    # victim_reason's guards, and for a job that is not preemptible its shortest-remaining-first test, inline
    # (a search may walk thousands of running jobs); its reason is written for the chosen victims only.
    ratio, runtime, job_rank = config.preempt_shorter_ratio, req.expected_runtime_s or 0.0, rank(req.priority)
    members, holdings = view.members, cluster.holdings
    # (in any order: the best set is the least cost, ties by fleet order, and victims are sorted)
    for r in candidates.values():
        if not guards_allow(r, config, now):
            continue
        if not r.preemptible:
            if not (longer and r.checkpointable) or r.expected_end is None or rank(r.priority) < job_rank:
                continue  # never a victim (victim_reason), and most running jobs are not preemptible
            if r.expected_end - now < ratio * runtime:
                continue
        shares = holdings.get(r.job_id, ())
        if not shares or (len(shares) > 1):
            continue  # victims span one node only, so freeing them frees GPUs where they are needed
        share = shares[0]
        if share.node not in members or (avoid and share.node in avoid):
            continue
        if r.preemptible and not victim_reason(job, r, usage, teams, config, now):
            continue
        yield r, share


def _fewest(
    job: PendingJob, have: int, victims: list[tuple[RunningJob, int]], usage: Mapping[str, int],
    teams: Mapping[str, TeamPolicy], config: PolicyConfig, now: float,
) -> tuple[list[Preemption], int] | None:
    """Victims among `victims` (each with the GPUs it frees) that free what `have` free GPUs lack for the job,
    lowest priority first, then the most recently started (least work lost); and the GPUs they free."""
    req = job.request
    victims.sort(key=lambda v: (-rank(v[0].priority), -v[0].started_at, v[0].job_id))
    chosen, freed = [], 0
    for r, n in victims:
        if have + freed >= req.gpus:
            break
        chosen.append(Preemption(r.job_id, req.job_id, victim_reason(job, r, usage, teams, config, now) or ""))
        freed += n
    if have + freed < req.gpus or not chosen:
        return None
    return chosen, freed


def _for_gang(
    cluster: ClusterState, job: PendingJob, view: StaticView, by_node: dict[str, list[tuple[RunningJob, int]]],
    usage: Mapping[str, int], teams: Mapping[str, TeamPolicy], config: PolicyConfig, now: float,
    avoid: Mapping[str, int] | None,
) -> list[Preemption] | None:
    """Victims for a gang: on nodes of one model within one cluster and pool (a gang stays within one, and one
    model sets no slower pace), where they free the fewest GPUs, counting the GPUs free there now."""
    req, profile = job.request, config.profile
    have: dict[tuple[str, str, str], int] = {}
    victims: dict[tuple[str, str, str], list[tuple[RunningJob, int]]] = {}
    for name in dict.fromkeys([*cluster.with_free(view), *by_node]):
        node = cluster.nodes[name]
        if (avoid and name in avoid) or unavailable(cluster, req, node, profile, now):
            continue
        group = (*gang_group(node), node.model)
        have[group] = have.get(group, 0) + len(usable(cluster, req, name))
        victims.setdefault(group, []).extend(by_node.get(name, ()))
    best: tuple[tuple[int, int], list[Preemption]] | None = None
    for group, free in have.items():
        chosen = _fewest(job, free, victims[group], usage, teams, config, now)
        if chosen is not None and (best is None or (chosen[1], len(chosen[0])) < best[0]):
            best = ((chosen[1], len(chosen[0])), chosen[0])
    return best[1] if best else None
