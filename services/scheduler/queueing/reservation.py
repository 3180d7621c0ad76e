"""EASY backfill: reserve the start of the first job that cannot start now (and of aged jobs).

The reservation says when (the shadow time: running jobs end, by their
estimates, until the job fits) and where (nodes, with how many GPUs others may
still take there). A later job may start now only if it ends by the shadow
time or stays within those spare GPUs, so it never delays the reserved start.

It blocks only what it must: only nodes that could ever hold the job are
reserved (a one-node job of 8 GPUs never holds a 4-GPU node), a running job
without an estimate counts with its assumed end (by workload class), and when
no start can be foreseen, a one-node job holds the one node it is closest to
fitting on, not the whole fleet.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..placement import ClusterState, JobRequest, Placement, Profile
from ..placement.framework import available, eligible, unavailable, usable
from ..placement.moments import at
from .jobs import PendingJob, RunningJob
from .running import EndKey, RunningJobs


@dataclass
class Reservation:
    job_id: str
    # When the job can start by the running jobs' estimates; None: not known (some
    # running job has no estimate), so only GPUs it could never use are spare.
    start: float | None
    spare: dict[str, int] = field(default_factory=dict)

    def allows(self, placement: Placement, end: float | None) -> bool:
        """A job placed so, ending at `end`, leaves the reserved start intact."""
        if end is not None and self.start is not None and end <= self.start:
            return True
        return all(len(s.gpu_indices) <= self.spare.get(s.node, len(s.gpu_indices)) for s in placement.shares)

    def take(self, placement: Placement, end: float | None) -> None:
        """Account for a backfilled job that holds reserved nodes past the start."""
        if end is not None and self.start is not None and end <= self.start:
            return
        for s in placement.shares:
            if s.node in self.spare:
                self.spare[s.node] -= len(s.gpu_indices)

    def describe(self) -> str:
        """Human words for the reservation (its start a moment the edge puts in words, `placement.moments`)."""
        if not self.spare:
            return "holds no node: none it may use can take it now"
        when = f"at {at(self.start)}" if self.start is not None else "when running jobs end"
        nodes = ", ".join(sorted(self.spare)[:3]) + (f" +{len(self.spare) - 3}" if len(self.spare) > 3 else "")
        return f"reserved to start {when} on {nodes}"


@dataclass
class Reservations:
    """The reservations of one pass (the head's, then those of aged jobs): a later job must keep them all."""

    held: list[Reservation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.held)

    def allows(self, placement: Placement, end: float | None) -> bool:
        """A job placed so, ending at `end`, leaves every reserved start intact."""
        return all(r.allows(placement, end) for r in self.held)

    def take(self, placement: Placement, end: float | None) -> None:
        """Account for a job that starts within the reservations."""
        for r in self.held:
            r.take(placement, end)

    @property
    def spare(self) -> dict[str, int]:
        """GPUs others may still take per reserved node (the least any reservation spares)."""
        out: dict[str, int] = {}
        for r in self.held:
            for node, n in r.spare.items():
                out[node] = min(n, out.get(node, n))
        return out

    def blocking(self, placement: Placement, end: float | None) -> Reservation:
        """The first reservation the placement would break (the head's if none)."""
        return next((r for r in self.held if not r.allows(placement, end)), self.held[0])

    def ends_after_all(self, end: float) -> bool:
        """A job ending no sooner than `end` ends after every reserved start, so it must keep within the spare
        GPUs (and none are spare where no placement is found with `spare` as caps)."""
        return all(r.start is None or end > r.start for r in self.held)

    def holds(self, job_id: str) -> bool:
        return any(r.job_id == job_id for r in self.held)


def reserve(
    cluster: ClusterState,
    job: PendingJob,
    running: Mapping[str, RunningJob],
    profile: Profile,
    now: float,
    taken: Reservations | None = None,
) -> Reservation:
    """Where and when the job will start if nothing else starts before it.

    With `taken`, nodes that earlier reservations hold whole are left to them (unless no other node
    could ever hold the job), so a second reservation is not stacked on the first one's nodes.
    """
    req = job.request
    gang = req.gpus > eligible(cluster, req, profile).max_gpus_per_node
    if not gang and isinstance(running, RunningJobs) and not (taken and taken.spare):
        quick = _one_node(cluster, job, running, profile, now)
        if quick is not None:
            return quick
    free = _usable_now(cluster, req, profile, now, gang, taken)
    found = _fits(free, req.gpus, gang)
    total = sum(free.values())
    start: float | None = now
    # Running jobs by their end (unknown ends last), popped only until the job fits. Only jobs on the nodes
    # it could use count: the others never make it fit, and the answer is the same without them.
    for unknown, end, job_id in ([] if found else _by_end(cluster, running, free)):
        r = running[job_id]
        if unknown:
            start = None
            break
        start = max(now, end)
        for share in cluster.holdings[r.job_id]:
            if share.node in free:
                free[share.node] += cluster.freeable(share)
                total += cluster.freeable(share)
                # Only a node that just gained GPUs can newly fit a one-node job.
                if not gang and free[share.node] >= req.gpus:
                    found = {share.node: req.gpus}
        if gang and total >= req.gpus:
            found = _fits(free, req.gpus, gang)
        if found:
            break
    if not found:
        # No start can be foreseen (an end is unknown, or not even all ends free enough). A gang holds every
        # node it could use; a one-node job the node nearest to holding it (most GPUs free or held by jobs
        # that will end), so that the rest of the fleet keeps working.
        if gang or not free:
            return Reservation(job.job_id, None, {n: 0 for n in free})
        best = max(free, key=lambda n: (free[n], n))
        return Reservation(job.job_id, None, {best: 0})
    spare = {n: free[n] - used for n, used in found.items()}
    return Reservation(job.job_id, start, spare)


def _one_node(
    cluster: ClusterState, job: PendingJob, running: RunningJobs, profile: Profile, now: float
) -> Reservation | None:
    """`reserve`'s answer for a one-node job that fits now or once some jobs end, looking only at the nodes
    with enough GPUs free and those the soonest-ending jobs hold (not every node); None: no start can be
    foreseen, the full walk says what it holds.

    The same answer: the node with the fewest usable GPUs free that holds the job (fleet order among equals),
    else the ends walked in the same order with each node's usable GPUs counted the first time it is met."""
    req = job.request
    view = eligible(cluster, req, profile)
    free: dict[str, int] = {}  # usable GPUs free on each node met that could hold the job
    others: set[str] = set()  # nodes met that could not

    def could_hold(name: str) -> bool:
        if name in free:
            return True
        if name in others:
            return False
        node = cluster.nodes[name]
        if (name in view.members and len(node.gpus) >= req.gpus
                and unavailable(cluster, req, node, profile, now) is None):
            free[name] = len(usable(cluster, req, name))
            return True
        others.add(name)
        return False

    best: tuple[int, int, str] | None = None
    for m in view.models:
        for bucket in cluster.buckets[m][req.gpus:]:  # only nodes with that many GPUs free could hold it now
            for name in bucket:
                if could_hold(name) and free[name] >= req.gpus and (
                        best is None or (free[name], cluster.order[name]) < best[:2]):
                    best = (free[name], cluster.order[name], name)
    if best is not None:
        return Reservation(job.job_id, now, {best[2]: best[0] - req.gpus})
    holdings = cluster.holdings
    for unknown, end, job_id in running.by_end:
        shares = [s for s in holdings.get(job_id, ()) if could_hold(s.node)]
        if not shares:
            continue
        if unknown:
            return None
        fits = None
        for share in shares:
            free[share.node] += cluster.freeable(share)
            if free[share.node] >= req.gpus:
                fits = share.node
        if fits is not None:
            return Reservation(job.job_id, max(now, end), {fits: free[fits] - req.gpus})
    return None


def _usable_now(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, gang: bool, taken: Reservations | None
) -> dict[str, int]:
    """Usable GPUs free now on each node that could hold the job (not those earlier reservations hold whole)."""
    nodes = cluster.nodes
    could_hold = [n for n in eligible(cluster, req, profile).nodes if gang or len(nodes[n].gpus) >= req.gpus]
    free = {n: len(usable(cluster, req, n)) for n in available(cluster, req, could_hold, profile, now)}
    held = taken.spare if taken else {}
    if held:
        rest = {n: f for n, f in free.items() if held.get(n) != 0}
        if rest and (gang or any(len(cluster.nodes[n].gpus) >= req.gpus for n in rest)):
            return rest
    return free


def _by_end(
    cluster: ClusterState, running: Mapping[str, RunningJob], nodes: Mapping[str, int]
) -> Iterator[EndKey]:
    """(end unknown, end, job) of the running jobs holding GPUs on these nodes, soonest end first (unknown last).

    From the order `RunningJobs` keeps when given one (the pass stops at the first few), else sorted here."""
    if not isinstance(running, RunningJobs):
        ends = _ends_on(cluster, running, nodes)
        heapq.heapify(ends)
        while ends:
            yield heapq.heappop(ends)
        return
    holdings = cluster.holdings
    for key in running.by_end:
        shares = holdings.get(key[2])
        if shares and any(s.node in nodes for s in shares):
            yield key


def _ends_on(
    cluster: ClusterState, running: Mapping[str, RunningJob], nodes: Mapping[str, int]
) -> list[tuple[bool, float, str]]:
    """(end unknown, end, job) of the running jobs holding GPUs on these nodes."""
    out: list[tuple[bool, float, str]] = []
    seen: set[str] = set()
    for node in nodes:
        for job_id in cluster.jobs_on[node]:
            r = running.get(job_id)
            if r is None or job_id in seen:
                continue
            seen.add(job_id)
            end = _end(r)
            out.append((end is None, end or 0.0, job_id))
    return out


def _end(r: RunningJob) -> float | None:
    return r.expected_end if r.expected_end is not None else r.assumed_end


def _fits(free: dict[str, int], gpus: int, gang: bool) -> dict[str, int] | None:
    """Nodes (and GPUs on each) the job would take given these free counts, or None."""
    if not gang:
        best = None
        for n, f in free.items():
            if f >= gpus and (best is None or f < free[best]):
                best = n
        return {best: gpus} if best is not None else None
    if sum(free.values()) < gpus:
        return None
    taken, left = {}, gpus
    for n, f in sorted(free.items(), key=lambda item: -item[1]):
        if left <= 0:
            break
        if f:
            taken[n] = min(f, left)
            left -= taken[n]
    return taken
