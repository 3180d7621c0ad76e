"""`schedule(request) -> reply`: one pass of the queue policy, pure (no I/O, no clock).

The request holds the cluster's free GPUs (indexed), the waiting and running
jobs, team quotas and the policy; the reply holds the decisions: jobs to
start and where, jobs to preempt, jobs rejected as infeasible, and why every
examined job still waits. The pass applies its decisions to
`request.cluster` (GPUs handed out, victims' GPUs released) and removes the
started and rejected jobs from `request.queue`; the caller acts on the reply
(publishes, or advances the simulator) and requeues preempted jobs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from ..placement import ClusterState, Infeasible, Placement, place_on
from ..placement.framework import eligible
from .faster_wait import faster_start
from .jobs import PendingJob, PolicyConfig, RunningJob, TeamPolicy, rank
from .migration import Migration, make_room, plan_migrations, undo
from .pending import PendingQueue
from .preemption import Preemption, choose_victims
from .reservation import Reservation, reserve


@dataclass
class ScheduleRequest:
    now: float
    cluster: ClusterState
    queue: PendingQueue
    running: Mapping[str, RunningJob]
    config: PolicyConfig
    teams: Mapping[str, TeamPolicy] = field(default_factory=dict)


@dataclass(frozen=True)
class Started:
    job: PendingJob
    placement: Placement
    expected_end: float | None
    backfilled: bool = False


@dataclass
class ScheduleReply:
    started: list[Started] = field(default_factory=list)
    preempted: list[Preemption] = field(default_factory=list)
    infeasible: dict[str, str] = field(default_factory=dict)
    # Why each examined job still waits, in the order the policy considered them.
    waiting: dict[str, str] = field(default_factory=dict)
    reservation: Reservation | None = None
    # Running jobs moved (to faster GPUs, or out of a blocked job's way): stop each and resume it
    # from its checkpoint on the new placement, in this pass.
    migrated: list[Migration] = field(default_factory=list)


def expected_runtime(job: PendingJob, placement: Placement, config: PolicyConfig) -> float | None:
    """The policy's estimate of the job's runtime on this placement (None if unknown)."""
    base = job.request.expected_runtime_s
    if base is None:
        return None
    return base / placement.speed if config.estimates_scale_with_speed and placement.speed > 0 else base


def schedule(request: ScheduleRequest) -> ScheduleReply:
    """One pass: start what fits in policy order, backfill safely, preempt for the first blocked job."""
    cfg, cluster, now = request.config, request.cluster, request.now
    reply = ScheduleReply()
    usage: Counter[str] = Counter()
    for r in request.running.values():
        usage[r.team] += r.gpus
    has_quotas = any(t.quota_gpus is not None for t in request.teams.values())
    blocked: dict[tuple, str] = {}  # job shape -> why it cannot start now (cached for this pass)
    faster_starts: dict[tuple, tuple] = {}  # job shape -> when a faster model frees (cached for this pass)
    examined = misses = 0
    reservation: Reservation | None = None
    head_seen = False

    for job in request.queue.ordered(usage, request.teams):
        if examined >= cfg.scan_depth or misses >= cfg.max_misses_in_a_row:
            break
        req = job.request
        may_preempt = cfg.preemption and (req.priority in cfg.preempt_for or has_quotas)
        if cluster.total_free == 0 and not may_preempt:
            if not cfg.preemption or (cfg.use_priorities and not has_quotas and _cannot_preempt(req.priority, cfg)):
                break  # nothing is free and no later job may preempt either (classes come in rank order)
            reply.waiting[job.job_id] = "no GPU free"
            misses += 1
            continue
        examined += 1
        shape = _shape(cluster, req, cfg)
        why = blocked.get(shape)
        decision = None
        if why is None:
            decision = place_on(cluster, req, cfg.profile, now)
            if isinstance(decision, Infeasible):
                reply.infeasible[job.job_id] = decision.reason
                continue
            if not isinstance(decision, Placement):
                why = blocked[shape] = decision.reason
        if why is None:
            end = _end(now, job, decision, cfg)
            if reservation is not None and not reservation.allows(decision, end):
                decision = _place_within(cluster, job, cfg, now, reservation, shape, blocked)
                end = _end(now, job, decision, cfg) if decision else None
            if decision is not None and cfg.wait_for_faster_gain is not None:
                later = faster_start(cluster, job, decision, request.running, cfg, now, faster_starts)
                if later:
                    # Waiting by choice, not blocked: it takes no reservation and preempts nothing.
                    reply.waiting[job.job_id] = later
                    misses += 1
                    continue
            if decision is not None:
                if reservation is not None:
                    reservation.take(decision, end)
                _start(reply, cluster, usage, job, decision, end, backfilled=reservation is not None)
                misses = 0
                continue
            why = f"would delay {reservation.job_id}, {reservation.describe()}" if reservation else "no room"
        # The job cannot start now.
        misses += 1
        if not head_seen:
            head_seen = True
            # Only the first blocked job preempts, so preemption never undercuts a reservation.
            if may_preempt and _try_preemption(request, reply, usage, job):
                misses = 0
                continue
            if not cfg.backfill:
                reply.waiting[job.job_id] = why
                break  # strict FIFO: nothing overtakes the head
            reservation = reply.reservation = reserve(cluster, job, request.running, cfg.profile, now)
            if cfg.make_room_by_migration and _try_make_room(request, reply, usage, job, reservation):
                reservation = reply.reservation = None
                head_seen = False  # it started: the next blocked job is the one to reserve for
                misses = 0
                continue
            reply.waiting[job.job_id] = f"{why}; {reservation.describe()}"
            continue
        # The shell says how many jobs are ahead: `waiting` keeps the policy's order.
        reply.waiting[job.job_id] = why

    if cfg.migrate_min_gain_s is not None and cluster.total_free:
        reply.migrated += plan_migrations(cluster, _unmoved(request, reply), cfg, now, reservation)

    for s in reply.started:
        request.queue.remove(s.job.job_id)
    for job_id in reply.infeasible:
        request.queue.remove(job_id)
    return reply


def _cannot_preempt(priority: str, cfg: PolicyConfig) -> bool:
    """This class and every class ranked below it may not preempt."""
    return all(rank(p) < rank(priority) for p in cfg.preempt_for)


def _shape(cluster: ClusterState, req, cfg: PolicyConfig) -> tuple:
    """Jobs of one shape fit or not alike, so one failure answers for all of them in a pass."""
    view = eligible(cluster, req, cfg.profile)
    key: tuple = (id(view), req.gpus)
    if cluster.has_memory_telemetry:
        key += (req.min_memory_mib,)
    if cluster.has_leases:
        key += (req.expected_runtime_s, req.workload_class)
    return key


def _end(now: float, job: PendingJob, placement: Placement, cfg: PolicyConfig) -> float | None:
    runtime = expected_runtime(job, placement, cfg)
    return None if runtime is None else now + runtime


def _place_within(cluster, job, cfg, now, reservation: Reservation, shape, blocked) -> Placement | None:
    """Place using only GPUs the reservation can spare (cached per shape like any failure)."""
    key = (*shape, "within-reservation")
    if key in blocked:
        return None
    decision = place_on(cluster, job.request, cfg.profile, now, caps=reservation.spare)
    if isinstance(decision, Placement):
        return decision
    blocked[key] = "no room outside the reservation"
    return None


def _start(reply, cluster: ClusterState, usage, job: PendingJob, placement: Placement, end, backfilled: bool) -> None:
    cluster.allocate(job.job_id, placement, job.request.service)
    usage[job.request.team] += job.request.gpus
    reply.started.append(Started(job, placement, end, backfilled))


def _unmoved(request: ScheduleRequest, reply: ScheduleReply) -> Mapping[str, RunningJob]:
    """Running jobs this pass neither preempted nor moved yet."""
    moved = {p.victim for p in reply.preempted} | {m.job_id for m in reply.migrated}
    return {k: v for k, v in request.running.items() if k not in moved} if moved else request.running


def _try_make_room(request: ScheduleRequest, reply: ScheduleReply, usage, job: PendingJob, reservation) -> bool:
    """Move running jobs that fit elsewhere off a node the blocked job needs, then start it there."""
    cfg, cluster, now = request.config, request.cluster, request.now
    wait = None if reservation.start is None else reservation.start - now
    running = _unmoved(request, reply)
    moves = make_room(cluster, job, running, cfg, now, wait)
    if not moves:
        return False
    decision = place_on(cluster, job.request, cfg.profile, now)
    if not isinstance(decision, Placement):  # only if filters disagree with make_room: nothing moves
        undo(cluster, moves, running)
        return False
    reply.migrated.extend(m for m, _ in moves)
    _start(reply, cluster, usage, job, decision, _end(now, job, decision, cfg), backfilled=False)
    return True


def _try_preemption(request: ScheduleRequest, reply: ScheduleReply, usage, job: PendingJob) -> bool:
    cfg, cluster, now = request.config, request.cluster, request.now
    victims = choose_victims(cluster, job, request.running, usage, request.teams, cfg, now)
    if not victims:
        return False
    for p in victims:
        victim = request.running[p.victim]
        cluster.release(p.victim)
        usage[victim.team] -= victim.gpus
    reply.preempted.extend(victims)
    decision = place_on(cluster, job.request, cfg.profile, now)
    if not isinstance(decision, Placement):  # only if filters disagree with choose_victims; victims still go
        return False
    _start(reply, cluster, usage, job, decision, _end(now, job, decision, cfg), backfilled=False)
    return True
