"""Moves up: a running job on a slower model moves to free GPUs of a faster one (migration.py says when).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from itertools import islice

from ..placement import ClusterState, JobRequest, Placement, place_on
from ..placement.cluster import StaticView
from ..placement.framework import REFUSED, eligibility, eligible
from ..placement.scorers import candidate_speed
from .jobs import PolicyConfig, RunningJob
from .migration import Migration, Movable
from .reservation import Reservations
from .running import RunningJobs

NO_PLACEMENT = Migration("", Placement("", "", "", (), ()), None, "no placement")
NO_ROOM = Migration("", Placement("", "", "", (), ()), None, "no placement within the reservations")


def _up_candidates(
    cluster: ClusterState, running: Mapping[str, RunningJob], config: PolicyConfig, now: float, min_gain: float
) -> list[tuple[RunningJob, JobRequest, float, float]]:
    """Jobs whose gain, were they to run at the fastest free model's speed for their class, is enough, most
    gain first: (job, request, speed, time left). Not those with more GPUs than are free (moves keep that total)."""
    overhead, ratio, most = config.migration_overhead_s, config.migrate_max_ratio, config.max_migrations_per_job
    free_models = [m for m, n in cluster.free_by_model.items() if n > 0]
    if not free_models:
        return []
    total_free = cluster.total_free
    scored: list[tuple[float, str, int, RunningJob, JobRequest, float, float]] = []
    best_by_class: dict[str, float] = {}
    for r in _ending_after(running, now, min_gain):
        end, req, speed = r.expected_end, r.request, r.speed
        # `may_move` and movable's `left` asked before building anything: most running jobs stop here.
        if (end is None or end - now < min_gain or req is None or not speed or not r.checkpointable
                or r.migrations >= most or r.gpus > total_free):
            continue
        left = end - now
        cls = req.workload_class
        best = best_by_class.get(cls)
        if best is None:
            best = best_by_class[cls] = max(cluster.speed(m, cls) for m in free_models)
        then = overhead + left * speed / best
        if left - then >= min_gain and then <= ratio * left:
            scored.append((-(left - then), r.job_id, len(scored), r, req, speed, left))
    scored.sort()  # most gain, then by id (ties in kept order; the job itself is never compared)
    return [(r, req, speed, left) for *_, r, req, speed, left in scored]


def _ending_after(running: Mapping[str, RunningJob], now: float, min_gain: float) -> Iterable[RunningJob]:
    """The running jobs, or with `RunningJobs` those whose end is not before `now + min_gain` (less a rounding
    margin: the caller asks `end - now < min_gain` itself), from its kept order. Any order: the caller sorts."""
    if not isinstance(running, RunningJobs):
        return running.values()
    by_end = running.by_end
    i = bisect_left(by_end, (False, now + min_gain - 1e-6 * (abs(now) + abs(min_gain) + 1.0), ""))
    return (running[key[2]] for key in islice(by_end, i, None) if not key[0])


def plan_migrations(
    cluster: ClusterState,
    running: Mapping[str, RunningJob],
    config: PolicyConfig,
    now: float,
    reservation: Reservations | None = None,
) -> list[Migration]:
    """Move long jobs to faster free GPUs; applies the moves to `cluster` and returns them."""
    min_gain = config.migrate_min_gain_s
    if min_gain is None or cluster.total_free == 0:
        return []
    if (isinstance(running, RunningJobs) and min_gain > 0 and config.migration_overhead_s >= 0
            and not _some_may_gain(cluster, running, config)):
        return []  # (nothing moves: the running jobs need not be walked)
    moves: list[Migration] = []
    failed: set[tuple[int, int, tuple[str, ...]]] = set()  # target shapes that found no placement in this pass
    # Targets with no placement within the reservations, at `cluster.freed` then: until a move frees GPUs, a
    # job of that target that cannot end by every reserved start cannot move (`_move_up` would place it twice).
    no_room: dict[tuple[object, ...], int] = {}
    # Per eligibility, class and GPUs: the view and the models with that many GPUs free, at `cluster.changes`
    # then. Most candidates have none (on a full fleet the GPUs left free are often of the largest-memory model
    # their moves spare).
    targets: dict[tuple[object, ...], tuple[int, StaticView, tuple[tuple[str, float], ...]]] = {}
    for r, req, speed, left in _up_candidates(cluster, running, config, now, min_gain):
        if cluster.total_free < r.gpus:
            continue
        known = targets.get(group := (eligibility(req), req.workload_class, req.gpus > 1, r.gpus))
        if known is None or known[0] != cluster.changes:
            view = eligible(cluster, req, config.profile)
            models = _models(cluster, req, view, config.migrate_spares_largest_memory)
            known = targets[group] = (cluster.changes, view, free_targets(cluster, models, r.gpus))
        _, view, free = known
        if not free:
            continue
        # Only models fast enough for the ratio with the overhead: a job never moves sideways or back.
        faster = tuple(m for m, m_speed in free if cluster.free_by_model[m] >= r.gpus
                       and left * speed / m_speed + config.migration_overhead_s <= config.migrate_max_ratio * left)
        if not faster or (id(view), req.gpus, faster) in failed:
            continue
        room = (id(view), req.gpus, faster, req.min_memory_mib, req.workload_class, req.allow_multi_node,
                req.expected_runtime_s if cluster.has_leases else None)
        if reservation and no_room.get(room) == cluster.freed and reservation.ends_after_all(
                now + config.migration_overhead_s + left * speed / _fastest(cluster, req, faster)):
            continue
        move = _move_up(cluster, Movable(r, req, speed, left), replace(req, gpu_models=faster), config, now,
                        min_gain, reservation)
        if move is NO_ROOM:
            no_room[room] = cluster.freed
            continue
        if move is NO_PLACEMENT:
            failed.add((id(view), req.gpus, faster))
            continue
        if move is None:
            continue
        failed.clear()  # the GPUs it left are free now
        moves.append(move)
    return moves


def _some_may_gain(cluster: ClusterState, running: RunningJobs, config: PolicyConfig) -> bool:
    """Whether some group of running jobs that may move has a model with as many GPUs free as a job of it
    holds, on which it would run faster by `migrate_max_ratio`: a job moves only so (with a positive gain, a
    move's time left, overhead included, is at most that ratio of its own, `left * speed / m_speed` less)."""
    total_free = cluster.total_free
    fastest: dict[tuple[object, ...], float] = {}  # per eligibility, class and GPUs: the fastest free target
    for (static, cls, multi, gpus, speed), (_, req) in running.movers.items():
        if gpus > total_free:
            continue
        best = fastest.get(key := (static, cls, multi, gpus))
        if best is None:
            models = _models(cluster, req, eligible(cluster, req, config.profile), config.migrate_spares_largest_memory)
            best = fastest[key] = max((s for _, s in free_targets(cluster, models, gpus)), default=0.0)
        if speed <= config.migrate_max_ratio * best:
            return True
    return False


def _move_up(
    cluster: ClusterState, c: Movable, target: JobRequest, config: PolicyConfig, now: float, min_gain: float,
    reservation: Reservations | None,
) -> Migration | None:
    """Place the job on `target`'s faster models if that gains enough within the reservations; apply it.
    `NO_PLACEMENT`: no GPUs of those models can take it (no job of that shape can, this pass); `NO_ROOM`: the
    reservations keep it off them and no GPUs they spare can take it."""
    refused = _refuser(cluster, c, target, config, now, reservation) if reservation else None
    decision = place_on(cluster, target, config.profile, now, refused=refused)
    if decision is REFUSED and reservation:
        return _move_within(cluster, c, target, config, now, min_gain, reservation)
    if not isinstance(decision, Placement) or decision.speed <= 0:
        return NO_PLACEMENT
    new_left = config.migration_overhead_s + c.left * c.speed / decision.speed
    if reservation and not reservation.allows(decision, now + new_left):
        return _move_within(cluster, c, target, config, now, min_gain, reservation)
    return _apply(cluster, c, decision, new_left, config, now, min_gain, reservation)


def _move_within(
    cluster: ClusterState, c: Movable, target: JobRequest, config: PolicyConfig, now: float, min_gain: float,
    reservation: Reservations,
) -> Migration | None:
    """The move on GPUs the reservations spare."""
    decision = place_on(cluster, target, config.profile, now, caps=reservation.spare)
    if not isinstance(decision, Placement):
        return NO_ROOM
    if decision.speed <= 0:
        return None
    new_left = config.migration_overhead_s + c.left * c.speed / decision.speed
    return _apply(cluster, c, decision, new_left, config, now, min_gain, reservation)


def _apply(
    cluster: ClusterState, c: Movable, decision: Placement, new_left: float, config: PolicyConfig, now: float,
    min_gain: float, reservation: Reservations | None,
) -> Migration | None:
    """Make the move if it gains enough (None: it does not)."""
    if c.left - new_left < min_gain or new_left > config.migrate_max_ratio * c.left:
        return None
    end = now + new_left
    if reservation:
        reservation.take(decision, end)
    cluster.release(c.job.job_id)
    cluster.allocate(c.job.job_id, decision, c.request.service)
    return Migration(
        c.job.job_id, decision, end,
        f"migrate to faster GPUs: {decision.model} on {decision.node} finishes it in "
        f"{new_left / 3600:.1f} h instead of {c.left / 3600:.1f} h",
    )


def _refuser(
    cluster: ClusterState, c: Movable, target: JobRequest, config: PolicyConfig, now: float, reservation: Reservations
) -> Callable[[str], bool] | None:
    """For `place_on`: the nodes on which a reservation the move cannot end before refuses it (too few GPUs
    spare there), known from a bound on its end (its fastest speed); None when none may. Only when every target
    runs the job at a positive speed (each model's is; so must each interconnect's factor be), so a pick there
    would be a placement the reservations refuse."""
    ic = cluster.interconnects
    if target.gpus > 1 and min(ic.nvlink, ic.pcie) <= 0:
        return None
    end = now + config.migration_overhead_s + c.left * c.speed / _fastest(cluster, target, target.gpu_models)
    binding = [r.spare for r in reservation.held if r.start is None or end > r.start]
    if not binding:
        return None
    gpus = target.gpus
    return lambda node: any(spare.get(node, gpus) < gpus for spare in binding)


def free_targets(cluster: ClusterState, models: list[tuple[str, float]], gpus: int) -> tuple[tuple[str, float], ...]:
    """The models (with the job's speed on each) that have `gpus` GPUs free: a move goes to no other."""
    return tuple((m, s) for m, s in models if cluster.free_by_model[m] >= gpus)


def _fastest(cluster: ClusterState, req: JobRequest, models: tuple[str, ...]) -> float:
    """No placement of the job on these models runs faster (a model's speed for its class, times the best
    interconnect and cross-node factors for more than one GPU)."""
    fastest = max(cluster.speed(m, req.workload_class) for m in models)
    if req.gpus > 1:
        ic = cluster.interconnects
        fastest *= max(1.0, ic.nvlink, ic.pcie) * max(1.0, ic.cross_node)
    return fastest


def _models(cluster: ClusterState, req: JobRequest, view: StaticView, spare_largest: bool) -> list[tuple[str, float]]:
    """The job's speed on each model of its view; without the largest-memory model when it fits a smaller one.
    (Kept with the view: it reads only the nodes' static facts, the job's class and whether it needs one GPU.)"""

    def build() -> list[tuple[str, float]]:
        speeds: dict[str, float] = {}
        mem: dict[str, float] = {}
        for model, name in view.firsts.items():
            node = cluster.nodes[name]
            speeds[model] = candidate_speed(cluster, req, node)
            mem[model] = max(g.memory_total_mib for g in node.gpus)
        if spare_largest and len(set(mem.values())) > 1:
            del speeds[max(mem, key=lambda m: mem[m])]
        return [(m, s) for m, s in speeds.items() if s > 0]

    return cluster.derived(("up models", id(view), req.workload_class, req.gpus > 1, spare_largest), build)
