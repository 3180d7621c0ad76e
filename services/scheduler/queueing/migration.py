"""Migration: move running jobs (checkpoint, stop, resume at once elsewhere) instead of waiting.

Two moves, both a checkpoint-restart that keeps the work done and pays `migration_overhead_s`, and only for
jobs that resume from a checkpoint and have an estimate:

- up (`plan_migrations`, moves_up.py): waiting for a faster model would leave the slower GPUs idle while work waits, so
  every job starts at once on the best free placement; when GPUs of a faster model are still free after the
  queue had its turn (and the first blocked job's reservation spares them), a job on a slower model moves
  there if its remaining time drops by at least `migrate_min_gain_s` and to at most `migrate_max_ratio` of
  what it is. It only ever moves to a model faster by that ratio, so never sideways or back.
- out of the way (`make_room`): the first blocked job (say >80 GB, which only the H200s hold, or a whole
  node) gets room by moving jobs that fit elsewhere off the GPUs it needs, when the time they lose is within
  `make_room_budget` x its wait.

With `migrate_spares_largest_memory` neither kind of move puts a job that fits a smaller GPU on the
largest-memory model: those GPUs are the only ones the largest jobs can use.

Every move counts towards `max_migrations_per_job`, so a job cannot be moved down and up again without end.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from ..placement import ClusterState, JobRequest, NodeShare, Placement, Profile, place_on
from ..placement.cluster import StaticView
from ..placement.framework import available, eligible, may_be_unavailable, unavailable, usable
from ..placement.scorers import SAME_TIER
from .jobs import PendingJob, PolicyConfig, RunningJob


@dataclass(frozen=True)
class Migration:
    """Stop `job_id` where it runs and resume it from its checkpoint on `placement` (same pass)."""

    job_id: str
    placement: Placement
    expected_end: float | None
    reason: str


@dataclass(frozen=True)
class Movable:
    """A running job the policy may move: what it asked for, how fast it runs, how long it has left."""

    job: RunningJob
    request: JobRequest
    speed: float
    left: float


def movable(r: RunningJob, now: float, config: PolicyConfig) -> Movable | None:
    """The job as a candidate for a move, or None (no request, estimate or checkpoint; moved too often)."""
    if not may_move(r, config) or r.request is None or r.expected_end is None or r.speed is None:
        return None  # (may_move checked the last three; mypy needs them said here)
    return Movable(r, r.request, r.speed, r.expected_end - now)


def may_move(r: RunningJob, config: PolicyConfig) -> bool:
    """Whether the policy may move the job: a request, an estimate, a checkpoint, and not moved too often."""
    return (r.request is not None and r.expected_end is not None and r.checkpointable and bool(r.speed)
            and r.migrations < config.max_migrations_per_job)


Moves = list[tuple[Migration, tuple[NodeShare, ...]]]


def make_room(
    cluster: ClusterState,
    job: PendingJob,
    running: Mapping[str, RunningJob],
    config: PolicyConfig,
    now: float,
    wait_s: float | None,
) -> Moves | None:
    """Move running jobs off GPUs the blocked `job` needs so it can start now; the moves, or None.

    A one-node job gets the node that frees with the fewest GPUs moved, the moved jobs going to any other
    node; a gang gets GPUs on any of its nodes, the moved jobs going to nodes it cannot use. The least
    remaining work moves first. Worth it only when the GPU-seconds the moved jobs lose (restart overhead, a
    slower model) are at most `make_room_budget` x the job's wait (`wait_s`; None: unbounded) x its GPUs.
    Applies the moves to `cluster` (undone when not all fit); each comes with the GPUs the job held, for
    `undo`. The caller places `job`.
    """
    req = job.request
    if not room_possible(cluster, req):
        return None
    view = eligible(cluster, req, config.profile)
    if req.gpus > view.max_gpus_per_node:
        chosen = _room_for_gang(cluster, req, view, running, config, now)
        if chosen is None:
            return None
        where = f"{len({cluster.holdings[c.job.job_id][0].node for c in chosen})} node(s)"
        caps = dict.fromkeys(view.nodes, 0)  # the moved jobs go to nodes the gang cannot use
    else:
        best = _room_on_one_node(cluster, req, view, running, config, now)
        if best is None:
            return None
        where, chosen = best
        caps = {where: 0}  # the moved jobs go anywhere but the node they make room on
    budget = config.make_room_budget * (float("inf") if wait_s is None else wait_s) * req.gpus
    # None: not all of them could move (or it costs more than the wait), nothing changes.
    return _move_all(cluster, chosen, caps, config, now, budget, f"to make room for {req.job_id} on {where}")


def room_possible(cluster: ClusterState, req: JobRequest) -> bool:
    """Whether moves could make room for the job: each GPU a move frees on the job's node (a gang's nodes)
    takes one free elsewhere, so the job gets at most the GPUs free now. Fewer than it needs: none can, and
    `make_room` need not walk the nodes and try the moves only to undo them."""
    return cluster.total_free >= req.gpus


def _room_for_gang(
    cluster: ClusterState, req: JobRequest, view: StaticView, running: Mapping[str, RunningJob],
    config: PolicyConfig, now: float,
) -> list[Movable] | None:
    """The jobs to move off the gang's nodes so that enough of its GPUs are free (least remaining work first,
    of the jobs running on one of its nodes alone that may move)."""
    ok = available(cluster, req, view.nodes, config.profile, now)
    have = sum(len(usable(cluster, req, n)) for n in ok)
    if have >= req.gpus:
        return None  # it fits without moving anything
    holdings, jobs_on = cluster.holdings, cluster.jobs_on
    in_way = sorted((r.expected_end - now, job_id, r) for n in ok for job_id in jobs_on[n]
                    if (r := running.get(job_id)) is not None and r.expected_end is not None
                    and len(holdings[job_id]) == 1 and may_move(r, config))
    chosen: list[Movable] = []
    freed = 0
    for _, _, r in in_way:
        if have + freed >= req.gpus:
            break
        if (c := movable(r, now, config)) is not None:
            chosen.append(c)
            freed += r.gpus
    return chosen if have + freed >= req.gpus else None


def _most_free_first(cluster: ClusterState, view: StaticView) -> Iterator[tuple[str, int]]:
    """The view's nodes with how many GPUs each has free, most free first (from the buckets)."""
    buckets, members = [cluster.buckets[m] for m in view.models], view.members
    for free in range(max(len(b) for b in buckets) - 1, -1, -1):
        for b in buckets:
            if free < len(b):
                for n in b[free]:
                    if n in members:
                        yield n, free


def _room_on_one_node(
    cluster: ClusterState, req: JobRequest, view: StaticView, running: Mapping[str, RunningJob],
    config: PolicyConfig, now: float,
) -> tuple[str, list[Movable]] | None:
    """The node that frees with the fewest GPUs moved (then the least work), and the jobs to move off it.

    Nodes come most free first: one with fewer GPUs free needs at least `req.gpus - free` moved, so the
    walk stops once that is more than the best found (on a full fleet it visits a few nodes, not all)."""
    best: tuple[tuple[int, float, int], str, list[RunningJob]] | None = None
    most_moved = req.gpus  # (the best's GPUs moved, once found)
    holdings, jobs_on, most = cluster.holdings, cluster.jobs_on, config.max_migrations_per_job
    flagged, floor = may_be_unavailable(cluster, config.profile), cluster.memory_floor
    for n, free in _most_free_first(cluster, view):
        if best is not None and req.gpus - free > most_moved:
            break
        if (flagged is None or n in flagged) and unavailable(cluster, req, cluster.nodes[n], config.profile, now):
            continue
        # (every free GPU is usable when none is measured and each has the memory: `usable` says the same)
        need = req.gpus - (free if req.min_memory_mib <= floor[n] else len(usable(cluster, req, n)))
        if need <= 0 or (best is not None and need > most_moved):
            continue
        # (remaining time, job) of the jobs on this node alone that may move (`may_move`), cheapest first.
        jobs = sorted((r.expected_end - now, job_id, r) for job_id in jobs_on[n]
                      if (r := running.get(job_id)) is not None and r.expected_end is not None
                      and len(holdings[job_id]) == 1 and r.request is not None and r.checkpointable
                      and r.speed and r.migrations < most)
        picked: list[RunningJob] = []
        freed, left = 0, 0.0
        for job_left, _, r in jobs:
            if freed >= need:
                break
            picked.append(r)
            freed += r.gpus
            left += job_left
        if freed < need:
            continue
        cost = (freed, left, cluster.order[n])
        if best is None or cost < best[0]:
            best, most_moved = (cost, n, picked), freed
    if best is None:
        return None
    return best[1], [c for r in best[2] if (c := movable(r, now, config)) is not None]


def _move_all(
    cluster: ClusterState, chosen: list[Movable], caps: Mapping[str, int], config: PolicyConfig, now: float,
    budget: float, why: str,
) -> Moves | None:
    """Move every chosen job within `caps`, losing at most `budget` GPU-seconds; None (undone) if not all can."""
    moves: Moves = []
    lost = 0.0
    for c in chosen:
        target = off_largest(cluster, c.request, config.profile) if config.migrate_spares_largest_memory else c.request
        decision = place_on(cluster, target, config.profile, now, caps=caps)
        if not isinstance(decision, Placement) or decision.speed <= 0:
            break
        new_left = config.migration_overhead_s + c.left * c.speed / decision.speed
        lost += max(0.0, new_left - c.left) * c.job.gpus
        if lost > budget:
            break
        old = cluster.release(c.job.job_id)
        cluster.allocate(c.job.job_id, decision, c.request.service)
        moves.append((Migration(c.job.job_id, decision, now + new_left,
                                f"moved to {decision.model} on {decision.node} {why}"), old))
    else:
        return moves
    undo(cluster, moves, {c.job.job_id: c.job for c in chosen})
    return None


def undo(cluster: ClusterState, moves: Moves, running: Mapping[str, RunningJob]) -> None:
    """Put moved jobs back on the GPUs they held (latest move first)."""
    for m, old in reversed(moves):
        cluster.release(m.job_id)
        first, *others = old
        back = Placement(first.node, first.cluster, first.model, first.gpu_uuids, first.gpu_indices,
                         others=tuple(others))
        req = running[m.job_id].request
        cluster.allocate(m.job_id, back, req.service if req else None)


def off_largest(cluster: ClusterState, req: JobRequest, profile: Profile) -> JobRequest:
    """The request kept off the largest-memory model when the job fits a smaller one."""
    view = eligible(cluster, req, profile)
    mem = {m: max(g.memory_total_mib for g in cluster.nodes[n].gpus) for m, n in view.firsts.items()}
    largest = max(mem.values(), default=0.0)
    smaller = tuple(m for m, v in mem.items() if v < SAME_TIER * largest)
    return replace(req, gpu_models=smaller) if smaller else req
