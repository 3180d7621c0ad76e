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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..placement import ClusterState, Infeasible, JobRequest, Placement, Profile, place_on
from ..placement.cluster import StaticView
from ..placement.framework import REFUSED, eligible
from ..placement.scorers import SAME_TIER
from .jobs import PendingJob, PolicyConfig, RunningJob, TeamPolicy, rank
from .migration import Migration, make_room, off_largest, undo
from .moves_up import plan_migrations
from .pending import PendingQueue
from .preemption import Preemption, Stoppable, choose_victims, shorter
from .reservation import Reservation, Reservations, reserve
from .running import RunningJobs

# Jobs of one shape fit or not alike in one pass: (view, GPUs[, memory][, runtime, class]).
Shape = tuple[object, ...]


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
    reservation: Reservation | None = None  # the head's
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
    return _Pass(request).run()


class _Pass:
    """The state of one pass over the queue."""

    def __init__(self, request: ScheduleRequest) -> None:
        self.request, self.cfg, self.cluster, self.now = request, request.config, request.cluster, request.now
        self.reply = ScheduleReply()
        self.usage: Counter[str] = Counter()
        if isinstance(request.running, RunningJobs):
            self.usage.update(request.running.usage)  # kept as jobs start and end
        else:
            for r in request.running.values():
                self.usage[r.team] += r.gpus
        self.has_quotas = any(t.quota_gpus is not None for t in request.teams.values())
        self.blocked: dict[Shape, str] = {}  # job shape -> why it cannot start now (cached for this pass)
        # Shapes with no room outside the reservations, at `cluster.freed` then (fewer GPUs free, still none),
        # found for a job needing this much memory.
        self.no_room: dict[Shape, tuple[int, float]] = {}
        # Shapes whose placement the one reservation refused, at `cluster.changes` then (`_kept_by_reservation`).
        self.delayed: dict[Shape, int] = {}
        self.reservations = Reservations()
        self.head_seen = False
        self.misses = 0
        # Every blocked short job may stop longer ones, not only the head (`preempt_shorter_every_blocked`).
        self.every = request.config.preempt_shorter_every_blocked and request.config.preemption
        # For later blocked jobs: shapes and classes that found no victims, at `cluster.freed` then, for a job
        # of this estimate; what any victim could be (computed once, when first asked).
        self.no_victims: dict[Shape, tuple[int, float]] = {}
        self._stoppable: Stoppable | None = None
        self.searches = 0  # victim searches made for them (at most `max_preemption_searches`)
        # The memory above which only the largest-memory model fits, when a waiting job needs it (else 0).
        cfg = request.config
        self.largest_needed = _largest_needed(request) if cfg.spare_largest_memory_while_needed else 0.0
        # The same memory, when long jobs that could not be moved keep off the largest model (else 0).
        self.unmovable_off = _runner_up(request.cluster) if cfg.unmovable_on_largest_max_s is not None else 0.0

    def run(self) -> ScheduleReply:
        cfg, cluster, reply, now = self.cfg, self.cluster, self.reply, self.now
        waiting, blocked, profile, held = reply.waiting, self.blocked, cfg.profile, self.reservations.held
        preempt_for, has_quotas, short_max = cfg.preempt_for, self.has_quotas, cfg.preempt_shorter_max_s
        aging = cfg.aging_s if cfg.backfill else None
        every = self.every
        examined = 0
        for job in self.request.queue.ordered(self.usage, self.request.teams, now):
            if examined >= cfg.scan_depth or self.misses >= cfg.max_misses_in_a_row:
                break
            req = job.request
            shorter_now = short_max is not None and (every or not self.head_seen) and shorter(job, cfg)
            may_preempt = cfg.preemption and (req.priority in preempt_for or has_quotas or shorter_now)
            if cluster.total_free == 0 and not may_preempt:
                if not cfg.preemption or (cfg.use_priorities and not has_quotas and not every
                                          and _cannot_preempt(req.priority, cfg)):
                    break  # nothing is free and no later job may preempt either (classes come in rank order)
                self.misses += 1  # (no reason of its own: the shell explains jobs the pass did not examine)
                continue
            examined += 1
            if every and self.head_seen and cluster.total_free == 0:
                if not has_quotas and self.stoppable().none:
                    break  # nothing is free and no running job may be stopped: no later job can start
                if shorter_now and (aging is None or now - job.submit_time < aging
                                    or len(held) >= cfg.max_reservations):
                    # Nothing is free and it holds no reservation: it starts only by stopping longer jobs (as
                    # `_consider` would find after failing to place it), with no reason of its own otherwise.
                    self.misses += 1
                    if self._preempt_for_later(job):
                        self.misses = 0
                    continue
            if not self.largest_needed and not self.unmovable_off:
                view = eligible(cluster, req, profile)
                shape = _shape(cluster, req, view)
            else:
                req, view, shape = self._request_for(job)
            # Most jobs after the head are of a shape already found blocked in this pass: `_consider` in short.
            if self.head_seen and not shorter_now and (aging is None or now - job.submit_time < aging
                                   or len(held) >= cfg.max_reservations) and (why := blocked.get(shape)):
                self.misses += 1
                waiting[req.job_id] = why
                continue
            if self._consider(job, may_preempt, req, view, shape):
                break
        if cfg.migrate_min_gain_s is not None and cluster.total_free:
            reply.migrated += plan_migrations(cluster, _unmoved(self.request, reply), cfg, self.now, self.reservations)
        for s in reply.started:
            self.request.queue.remove(s.job.job_id)
        for job_id in reply.infeasible:
            self.request.queue.remove(job_id)
        return reply

    def _consider(self, job: PendingJob, may_preempt: bool, req: JobRequest, view: StaticView, shape: Shape) -> bool:
        """Start the job (`req`: its request, or kept off the largest model; `view`, `shape`: the request's), or
        say why it waits (reserving for it if it is the head or aged); True: stop the pass."""
        cfg, cluster, now, reply = self.cfg, self.cluster, self.now, self.reply
        why = self.blocked.get(shape)
        if why is None:
            why = self._kept_by_reservation(job, req, view, shape)
        if why is None:
            profile = cfg.profile_for(job)
            decision = place_on(cluster, req, profile, now, refused=self._refuser(job, req, view))
            if isinstance(decision, Infeasible) and req is not job.request:
                req = job.request  # only the largest-memory model could ever hold it after all
                view = eligible(cluster, req, cfg.profile)
                shape = _shape(cluster, req, view)
                decision = place_on(cluster, req, profile, now)
            if isinstance(decision, Infeasible):
                reply.infeasible[req.job_id] = decision.reason
                return False
            if isinstance(decision, Placement) or decision is REFUSED:  # (REFUSED: placed within, if it can)
                why = self._start_within(job, req, view, decision if isinstance(decision, Placement) else None, shape)
                if why is None:
                    return False
            else:
                why = self.blocked[shape] = decision.reason
        # The job cannot start now.
        self.misses += 1
        if not self.head_seen:
            return self._head(job, may_preempt, why)
        if self.every and shorter(job, cfg) and self._preempt_for_later(job):
            self.misses = 0
            return False
        aging = cfg.aging_s
        if (aging is not None and cfg.backfill and now - job.submit_time >= aging
                and len(self.reservations.held) < cfg.max_reservations):
            # A job waiting past the aging bound holds a start of its own too, so backfill cannot starve it.
            held = reserve(cluster, job, self.request.running, cfg.profile, now, self.reservations)
            self.reservations.held.append(held)
            reply.waiting[req.job_id] = f"{why}; waited past the aging bound, {held.describe()}"
            return False
        # The shell says how many jobs are ahead: `waiting` keeps the policy's order.
        reply.waiting[req.job_id] = why
        return False

    def _preempt_for_later(self, job: PendingJob) -> bool:
        """Shortest remaining first for a blocked job after the head (`_try_preemption` with the reservations),
        skipped where the answer is known: no running job it could stop has `preempt_shorter_ratio` x its
        estimate left, or a job of its shape and class with no longer an estimate found no victims since the
        cluster last freed GPUs (victims only go in a pass, GPUs only get taken, and reservations only add nodes
        to avoid, so the search would fail again). With quotas, victims depend on each team's use, which changes
        in the pass: then every job searches."""
        cfg, cluster, req = self.cfg, self.cluster, job.request
        runtime = req.expected_runtime_s or 0.0
        key = None if self.has_quotas else (id(eligible(cluster, req, cfg.profile)), req.gpus, req.min_memory_mib,
                                            req.priority)
        if not self._may_find_victims(job) or (key is not None and self._failed_before(key, runtime)):
            return False
        if cfg.max_preemption_searches is not None and self.searches >= cfg.max_preemption_searches:
            return False
        self.searches += 1
        stopped = len(self.reply.preempted)
        if _try_preemption(self.request, self.reply, self.usage, job, self.reservations):
            return True
        if key is not None and len(self.reply.preempted) == stopped:
            self.no_victims[key] = (cluster.freed, runtime)
        return False

    def _failed_before(self, key: Shape, runtime: float) -> bool:
        """A job of this key with no longer an estimate found no victims, and no GPU was freed since."""
        failed = self.no_victims.get(key)
        return failed is not None and failed[0] == self.cluster.freed and runtime >= failed[1]

    def _may_find_victims(self, job: PendingJob) -> bool:
        """False when no running job could be its victim, by class or as a longer job (quotas: always True)."""
        return self.has_quotas or self.stoppable().may_have_victims_for(job, self.cfg)

    def stoppable(self) -> Stoppable:
        """What a victim could be in this pass (victims only go during a pass, so it stays an upper bound)."""
        if self._stoppable is None:
            self._stoppable = Stoppable.among(self.request.running, self.cfg, self.now)
        return self._stoppable

    def _request_for(self, job: PendingJob) -> tuple[JobRequest, StaticView, Shape]:
        """The job's request, kept off the largest-memory model while a job that needs that memory waits
        (`spare_largest_memory_while_needed`) or when it runs long and could not be moved off again
        (`unmovable_on_largest_max_s`), unless it has waited past the aging bound itself; its view and shape."""
        cfg, req = self.cfg, job.request
        mib, needed, unmovable = req.min_memory_mib, self.largest_needed, self.unmovable_off
        keep_off = (needed and mib <= needed) or (unmovable and mib <= unmovable and self._long_and_unmovable(job))
        if keep_off and (cfg.aging_s is None or self.now - job.submit_time < cfg.aging_s):
            req = off_largest(self.cluster, req, cfg.profile)
        view = eligible(self.cluster, req, cfg.profile)
        return req, view, _shape(self.cluster, req, view)

    def _long_and_unmovable(self, job: PendingJob) -> bool:
        """Whether the job runs longer than `unmovable_on_largest_max_s` (or says nothing) and no move could take
        it off its GPUs once it runs: it keeps no checkpoint, or it is a gang over nodes."""
        limit, req = self.cfg.unmovable_on_largest_max_s, job.request
        runtime = req.expected_runtime_s
        long = limit is not None and (runtime is None or runtime > limit)
        return long and (not job.checkpointable or req.gpus > _most_gpus_per_node(self.cluster))

    def _start_within(
        self, job: PendingJob, req: JobRequest, view: StaticView, decision: Placement | None, shape: Shape
    ) -> str | None:
        """Start the job on `decision`, or within the reservations (None: the one reservation refuses it
        wherever it is placed); None when it started, else why it cannot."""
        cfg, cluster, now, reply = self.cfg, self.cluster, self.now, self.reply
        end = None if decision is None else _end(now, job, decision, cfg)
        if decision is None or (self.reservations and not self.reservations.allows(decision, end)):
            held = self.reservations.held
            blocking = held[0] if decision is None else self.reservations.blocking(decision, end)
            within = _place_within(cluster, req, cfg.profile_for(job), now, self.reservations, shape, self.no_room)
            if within is None:
                # (known for this job too when computed as free GPUs are now, for a job needing no more memory)
                if len(self.reservations.held) == 1 and self.no_room[shape] == (cluster.freed, req.min_memory_mib):
                    if (key := _delay_key(req, view, shape)) is not None:
                        self.delayed[key] = cluster.changes
                return f"would delay {blocking.job_id}, {blocking.describe()}"
            decision, end = within, _end(now, job, within, cfg)
        placed = decision
        if self.reservations:
            self.reservations.take(placed, end)
        _start(reply, cluster, self.usage, job, placed, end, backfilled=bool(self.reservations))
        self.misses = 0
        return None

    def _refuser(self, job: PendingJob, req: JobRequest, view: StaticView) -> Callable[[str], bool] | None:
        """For `place_on`: the nodes on which the one reservation refuses the job (too few GPUs spare there),
        when it cannot end by the reserved start; None otherwise. A pick there is refused, so it is not scored."""
        held = self.reservations.held
        if len(held) != 1:
            return None
        r, gpus = held[0], req.gpus
        if r.start is not None and _earliest_end(self.cluster, self.now, job, req, view, self.cfg) <= r.start:
            return None
        spare = r.spare
        return lambda node: spare.get(node, gpus) < gpus

    def _kept_by_reservation(self, job: PendingJob, req: JobRequest, view: StaticView, shape: Shape) -> str | None:
        """Why the job would delay the one reservation, known without placing it; None: place it to know.

        Known when a job of its shape was placed and refused in this very state of the cluster (so this one
        has a placement too, and none outside the reservation) and this one cannot end by the reserved start
        whatever GPUs it gets: the pass would place it, score its candidates and throw the placement away."""
        held = self.reservations.held
        if len(held) != 1:
            return None
        key = _delay_key(req, view, shape)
        if key is None or self.delayed.get(key) != self.cluster.changes:
            return None
        r = held[0]
        if r.start is not None and _earliest_end(self.cluster, self.now, job, req, view, self.cfg) <= r.start:
            return None
        return f"would delay {r.job_id}, {r.describe()}"

    def _head(self, job: PendingJob, may_preempt: bool, why: str) -> bool:
        """The first job that cannot start: it preempts, or has room made, or reserves. True: stop the pass."""
        cfg, cluster, now, reply = self.cfg, self.cluster, self.now, self.reply
        self.head_seen = True
        # Only the first blocked job preempts, so preemption never undercuts a reservation.
        if may_preempt and self._may_find_victims(job) and _try_preemption(self.request, reply, self.usage, job):
            self.misses = 0
            return False
        if not cfg.backfill:
            reply.waiting[job.job_id] = why
            return True  # strict FIFO: nothing overtakes the head
        head = reserve(cluster, job, self.request.running, cfg.profile, now)
        if cfg.make_room_by_migration and _try_make_room(self.request, reply, self.usage, job, head):
            self.head_seen = False  # it started: the next blocked job is the one to reserve for
            self.misses = 0
            return False
        self.reservations.held.insert(0, head)
        reply.reservation = head
        reply.waiting[job.job_id] = f"{why}; {head.describe()}"
        return False


def _runner_up(cluster: ClusterState) -> float:
    """The fleet's largest GPU memory size below the largest tier (MiB; 0: none), kept until a node changes."""
    def below() -> float:
        sizes = sorted(set(cluster.memory.values()))
        return max((s for s in sizes if s < SAME_TIER * sizes[-1]), default=0.0) if sizes else 0.0
    return cluster.derived(("memory below the largest",), below)


def _most_gpus_per_node(cluster: ClusterState) -> int:
    return cluster.derived(("most GPUs per node",), lambda: max((len(n.gpus) for n in cluster.nodes.values()),
                                                                default=0))


def _largest_needed(request: ScheduleRequest) -> float:
    """The runner-up GPU memory size of the fleet if a waiting job needs more than it, else 0."""
    runner_up = _runner_up(request.cluster)
    return runner_up if runner_up and request.queue.any_needs_memory_above(runner_up) else 0.0


def _cannot_preempt(priority: str, cfg: PolicyConfig) -> bool:
    """This class and every class ranked below it may not preempt."""
    return all(rank(p) < rank(priority) for p in cfg.preempt_for)


def _shape(cluster: ClusterState, req: JobRequest, view: StaticView) -> Shape:
    """Jobs of one shape (`view`: their eligible nodes) fit or not alike, so one failure answers for all of them
    in a pass."""
    key: Shape = (id(view), req.gpus)
    if cluster.has_memory_telemetry:
        key += (req.min_memory_mib,)
    if cluster.has_leases:
        key += (req.expected_runtime_s, req.workload_class)
    return key


def _delay_key(req: JobRequest, view: StaticView, shape: Shape) -> Shape | None:
    """Jobs of this key have a placement alike and none within the reservations alike (None: not known so,
    a job that may split over nodes when no node is free enough: its split may run too slowly)."""
    if req.allow_multi_node and 1 < req.gpus <= view.max_gpus_per_node:
        return None
    return (*shape, req.min_memory_mib, req.allow_multi_node)


def _earliest_end(
    cluster: ClusterState, now: float, job: PendingJob, req: JobRequest, view: StaticView, cfg: PolicyConfig
) -> float:
    """No placement of the job ends before this (-inf: no bound; inf: the end is unknown)."""
    base = job.request.expected_runtime_s
    if base is None:
        return float("inf")
    if base < 0:
        return float("-inf")
    if not cfg.estimates_scale_with_speed:
        return now + base
    return now + base / cluster.derived(("fastest", id(view), req.workload_class, req.gpus > 1),
                                        lambda: _fastest_on(cluster, req, view))


def _fastest_on(cluster: ClusterState, req: JobRequest, view: StaticView) -> float:
    """No placement of the job on the view runs faster than this, nor than 1 (kept with the view)."""
    fastest = max((cluster.speed(m, req.workload_class) for m in view.models), default=1.0)
    if req.gpus > 1:  # (a placement's speed: its model's, times its interconnect's, times cross-node's)
        ic = cluster.interconnects
        fastest *= max(1.0, ic.nvlink, ic.pcie) * max(1.0, ic.cross_node)
    return max(fastest, 1.0)


def _end(now: float, job: PendingJob, placement: Placement, cfg: PolicyConfig) -> float | None:
    runtime = expected_runtime(job, placement, cfg)
    return None if runtime is None else now + runtime


def _place_within(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, reservation: Reservations, shape: Shape,
    no_room: dict[Shape, tuple[int, float]],
) -> Placement | None:
    """Place using only GPUs the reservation can spare (cached per shape like any failure, with `cluster.freed`)."""
    if shape in no_room:
        return None
    decision = place_on(cluster, req, profile, now, caps=reservation.spare)
    if isinstance(decision, Placement):
        return decision
    no_room[shape] = (cluster.freed, req.min_memory_mib)
    return None


def _start(
    reply: ScheduleReply, cluster: ClusterState, usage: Counter[str], job: PendingJob, placement: Placement,
    end: float | None, backfilled: bool,
) -> None:
    cluster.allocate(job.job_id, placement, job.request.service)
    usage[job.request.team] += job.request.gpus
    reply.started.append(Started(job, placement, end, backfilled))


def _unmoved(request: ScheduleRequest, reply: ScheduleReply) -> Mapping[str, RunningJob]:
    """Running jobs this pass neither preempted nor moved yet."""
    moved = {p.victim for p in reply.preempted} | {m.job_id for m in reply.migrated}
    return {k: v for k, v in request.running.items() if k not in moved} if moved else request.running


def _try_make_room(
    request: ScheduleRequest, reply: ScheduleReply, usage: Counter[str], job: PendingJob, reservation: Reservation
) -> bool:
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


def _try_preemption(
    request: ScheduleRequest, reply: ScheduleReply, usage: Counter[str], job: PendingJob,
    reservations: Reservations | None = None,
) -> bool:
    """Stop victims for the job and start it on the GPUs they free; with `reservations` (a job after the first
    blocked one), only victims on nodes no reservation counts on, and the job placed within the reservations."""
    cfg, cluster, now = request.config, request.cluster, request.now
    spare = reservations.spare if reservations else {}
    # Never a job this pass already moved (it holds its new GPUs only in this pass's bookkeeping).
    victims = choose_victims(cluster, job, _unmoved(request, reply), usage, request.teams, cfg, now, avoid=spare)
    if not victims:
        return False
    for p in victims:
        victim = request.running[p.victim]
        cluster.release(p.victim)
        usage[victim.team] -= victim.gpus
    reply.preempted.extend(victims)
    decision = place_on(cluster, job.request, cfg.profile, now, caps=spare or None)
    if not isinstance(decision, Placement):  # only if filters disagree with choose_victims; victims still go
        return False
    end = _end(now, job, decision, cfg)
    if reservations:
        reservations.take(decision, end)
    _start(reply, cluster, usage, job, decision, end, backfilled=False)
    return True
