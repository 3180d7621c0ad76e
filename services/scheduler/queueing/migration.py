"""Migration: move running jobs (checkpoint, stop, resume at once elsewhere) instead of waiting.

Two moves, both a checkpoint-restart that keeps the work done and pays
`migration_overhead_s`, and only for jobs that resume from a checkpoint and
have an estimate:

- up (`plan_migrations`): waiting for a faster model would leave the slower
  GPUs idle while work waits, so every job starts at once on the best free
  placement; when GPUs of a faster model are still free after the queue had
  its turn (and the first blocked job's reservation spares them), a job on a
  slower model moves there if its remaining time drops by at least
  `migrate_min_gain_s` and to at most `migrate_max_ratio` of what it is. It
  only ever moves to a model faster by that ratio, so never sideways or back.
- out of the way (`make_room`): the first blocked job (say >80 GB, which only
  the H200s hold, or a whole node) gets room by moving jobs that fit
  elsewhere off the GPUs it needs, when the time they lose is within
  `make_room_budget` x its wait.

Every move counts towards `max_migrations_per_job`, so a job cannot be moved
down and up again without end. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from ..placement import ClusterState, NodeShare, Placement, place_on
from ..placement.framework import eligible, unavailable, usable
from ..placement.scorers import candidate_speed
from .jobs import PendingJob, PolicyConfig, RunningJob
from .reservation import Reservation


@dataclass(frozen=True)
class Migration:
    """Stop `job_id` where it runs and resume it from its checkpoint on `placement` (same pass)."""

    job_id: str
    placement: Placement
    expected_end: float | None
    reason: str


def plan_migrations(
    cluster: ClusterState,
    running: Mapping[str, RunningJob],
    config: PolicyConfig,
    now: float,
    reservation: Reservation | None = None,
) -> list[Migration]:
    """Move long jobs to faster free GPUs; applies the moves to `cluster` and returns them."""
    min_gain = config.migrate_min_gain_s
    if min_gain is None or cluster.total_free == 0:
        return []
    overhead, ratio = config.migration_overhead_s, config.migrate_max_ratio
    free_models = [m for m, n in cluster.free_by_model.items() if n > 0]
    if not free_models:
        return []
    # Cheap bound first: the gain if the job ran at the fastest free model's speed for its class.
    candidates: list[tuple[float, RunningJob, float]] = []
    best_by_class: dict[str, float] = {}
    for r in running.values():
        if r.request is None or r.expected_end is None or not r.checkpointable or not r.speed:
            continue
        left = r.expected_end - now
        if left < min_gain or r.migrations >= config.max_migrations_per_job:
            continue
        cls = r.request.workload_class
        best = best_by_class.get(cls)
        if best is None:
            best = best_by_class[cls] = max(cluster.speed(m, cls) for m in free_models)
        bound = left - (overhead + left * r.speed / best)
        if bound >= min_gain and overhead + left * r.speed / best <= ratio * left:
            candidates.append((bound, r, left))
    if not candidates:
        return []
    candidates.sort(key=lambda c: (-c[0], c[1].job_id))
    moves: list[Migration] = []
    models_of: dict[tuple, list[tuple[str, float]]] = {}  # per view and class: (model, the job's speed there)
    failed: set[tuple] = set()  # target shapes that found no placement in this pass
    for _, r, left in candidates:
        if cluster.total_free < r.gpus:
            continue
        req = r.request
        view = eligible(cluster, req, config.profile)
        key = (id(view), req.workload_class, req.gpus > 1)
        if key not in models_of:
            models_of[key] = _models(cluster, req, view, config.migrate_spares_largest_memory)
        # Only models fast enough for the ratio with the overhead: a job never moves sideways or back.
        faster = tuple(
            m for m, speed in models_of[key]
            if cluster.free_by_model[m] >= r.gpus and left * r.speed / speed + overhead <= ratio * left
        )
        if not faster or (id(view), req.gpus, faster) in failed:
            continue
        target = replace(req, gpu_models=faster)
        decision = place_on(cluster, target, config.profile, now)
        if not isinstance(decision, Placement):
            failed.add((id(view), req.gpus, faster))
            continue
        new_left = overhead + left * r.speed / decision.speed if decision.speed > 0 else float("inf")
        end = now + new_left
        if reservation is not None and not reservation.allows(decision, end):
            decision = place_on(cluster, target, config.profile, now, caps=reservation.spare)
            if not isinstance(decision, Placement):
                continue
            new_left = overhead + left * r.speed / decision.speed if decision.speed > 0 else float("inf")
            end = now + new_left
        if left - new_left < min_gain or new_left > ratio * left:
            continue
        if reservation is not None:
            reservation.take(decision, end)
        cluster.release(r.job_id)
        cluster.allocate(r.job_id, decision, req.service)
        failed.clear()  # the GPUs it left are free now
        moves.append(Migration(
            r.job_id, decision, end,
            f"migrate to faster GPUs: {decision.model} on {decision.node} finishes it in "
            f"{new_left / 3600:.1f} h instead of {left / 3600:.1f} h",
        ))
    return moves


def make_room(
    cluster: ClusterState,
    job: PendingJob,
    running: Mapping[str, RunningJob],
    config: PolicyConfig,
    now: float,
    wait_s: float | None,
) -> list[tuple[Migration, tuple[NodeShare, ...]]] | None:
    """Move running jobs off GPUs the blocked `job` needs so it can start now; the moves, or None.

    A one-node job gets the node that frees with the fewest GPUs moved, the
    moved jobs going to any other node; a gang gets GPUs on any of its nodes,
    the moved jobs going to nodes it cannot use. The least remaining work moves
    first. Worth it only when the GPU-seconds the moved jobs lose (restart
    overhead, a slower model) are at most `make_room_budget` x the job's wait
    (`wait_s`; None: unknown, taken as unbounded) x its GPUs. Applies the moves
    to `cluster` (and undoes them when not all fit); each move comes with the
    GPUs the job held, for `undo`. The caller places `job`.
    """
    req = job.request
    view = eligible(cluster, req, config.profile)
    by_node: dict[str, list[RunningJob]] = {}
    for r in running.values():
        if r.request is None or r.expected_end is None or not r.checkpointable or not r.speed:
            continue
        if r.migrations >= config.max_migrations_per_job:
            continue
        shares = cluster.holdings.get(r.job_id, ())
        if len(shares) == 1 and shares[0].node in view.members:
            by_node.setdefault(shares[0].node, []).append(r)
    budget = float("inf") if wait_s is None else wait_s

    def remaining(r: RunningJob) -> tuple[float, str]:
        return ((r.expected_end or 0.0) - now, r.job_id)

    if req.gpus > view.max_gpus_per_node:
        # A gang: free GPUs on any of its nodes, by moving jobs to nodes it cannot use.
        have = sum(len(usable(cluster, req, n)) for n in view.nodes
                   if unavailable(cluster, req, cluster.nodes[n], config.profile, now) is None)
        movable = sorted((r for n, jobs in by_node.items()
                          if unavailable(cluster, req, cluster.nodes[n], config.profile, now) is None for r in jobs),
                         key=remaining)
        chosen, freed = [], 0
        for r in movable:
            if have + freed >= req.gpus:
                break
            chosen.append(r)
            freed += r.gpus
        if have + freed < req.gpus or not chosen:
            return None
        node = f"{len({cluster.holdings[r.job_id][0].node for r in chosen})} node(s)"
        caps = dict.fromkeys(view.nodes, 0)
    else:
        best: tuple[tuple, str, list[RunningJob]] | None = None
        for n, jobs in by_node.items():
            if unavailable(cluster, req, cluster.nodes[n], config.profile, now):
                continue
            need = req.gpus - len(usable(cluster, req, n))
            if need <= 0:
                continue
            # Cheapest first: the least remaining work moves.
            jobs.sort(key=remaining)
            picked, freed = [], 0
            for r in jobs:
                if freed >= need:
                    break
                picked.append(r)
                freed += r.gpus
            if freed < need:
                continue
            cost = (freed, sum(remaining(r)[0] for r in picked), cluster.order[n])
            if best is None or cost < best[0]:
                best = (cost, n, picked)
        if best is None:
            return None
        _, node, chosen = best
        caps = {node: 0}  # the moved jobs go anywhere but the node they make room on
    moves: list[tuple[Migration, tuple[NodeShare, ...]]] = []
    lost = 0.0
    for r in chosen:
        decision = place_on(cluster, r.request, config.profile, now, caps=caps)
        left = (r.expected_end or now) - now
        if not isinstance(decision, Placement) or decision.speed <= 0:
            break
        new_left = config.migration_overhead_s + left * r.speed / decision.speed
        lost += max(0.0, new_left - left) * r.gpus
        if lost > config.make_room_budget * budget * req.gpus:
            break
        old = cluster.release(r.job_id)
        cluster.allocate(r.job_id, decision, r.request.service)
        moves.append((Migration(
            r.job_id, decision, now + new_left,
            f"moved to {decision.model} on {decision.node} to make room for {req.job_id} on {node}",
        ), old))
    else:
        return moves
    # Not all of them could move (or it costs more than the wait): undo, nothing changes.
    undo(cluster, moves, running)
    return None


def undo(
    cluster: ClusterState, moves: list[tuple[Migration, tuple[NodeShare, ...]]], running: Mapping[str, RunningJob]
) -> None:
    """Put moved jobs back on the GPUs they held (latest move first)."""
    for m, old in reversed(moves):
        cluster.release(m.job_id)
        first, *others = old
        back = Placement(first.node, first.cluster, first.model, first.gpu_uuids, first.gpu_indices,
                         others=tuple(others))
        req = running[m.job_id].request
        cluster.allocate(m.job_id, back, req.service if req else None)


def _models(cluster: ClusterState, req, view, spare_largest: bool) -> list[tuple[str, float]]:
    """The job's speed on each model of its view; without the largest-memory model when it fits a smaller one."""
    speeds: dict[str, float] = {}
    mem: dict[str, float] = {}
    for name in view.nodes:
        node = cluster.nodes[name]
        if node.model not in speeds:
            speeds[node.model] = candidate_speed(cluster, req, node)
            mem[node.model] = max(g.memory_total_mib for g in node.gpus)
    if spare_largest and len(set(mem.values())) > 1:
        del speeds[max(mem, key=mem.get)]
    return [(m, s) for m, s in speeds.items() if s > 0]
