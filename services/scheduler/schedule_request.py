"""Turn the service's records into the queue policy's request, and its reasons into words. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from whaleflux.shared.catalog import model_key
from whaleflux.shared.events import JobSubmitted, NodeRegistered

from .placement import ClusterState, GpuState, Infeasible, JobRequest, NodeState, Profile, place_on
from .placement.filters import STATIC_FILTERS, gb, offers_mib
from .placement.scorers import candidate_speed
from .queueing import PendingJob, RunningJob
from .records import JobRecord, NodeCondition


@dataclass(frozen=True)
class NodeView:
    """One registered node as the scheduler sees it now."""

    registration: NodeRegistered
    condition: NodeCondition | None = None
    suspect: bool = False
    # What telemetry measured free per GPU (uuid -> MiB, less a driver reserve), and when the node's
    # lease ends (epoch seconds, from inventory): both unknown when absent.
    memory_free_mib: Mapping[str, float] = field(default_factory=dict)
    lease_expires_at: float | None = None
    # GPUs (uuids) in quarantine: no new work, whatever the node's condition.
    quarantined: frozenset[str] = frozenset()
    # What each GPU offers when idle (uuid -> MiB, telemetry's `Feeds.idle_free`): unknown (its nameplate) when absent.
    memory_idle_mib: Mapping[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.registration.cluster}/{self.registration.node}"

    @property
    def status(self) -> str:
        if self.condition is not None:
            return self.condition.state
        return "suspect" if self.suspect else "healthy"


def node_model(reg: NodeRegistered) -> str:
    """The catalogue key of the node's GPUs ("H100"), or the device's own name if unknown."""
    if not reg.gpus:
        return "unknown"
    return model_key(reg.gpus[0].model) or reg.gpus[0].model


def node_state(view: NodeView, alloc: Mapping[str, str]) -> NodeState:
    reg = view.registration
    gpus = tuple(
        GpuState(uuid=g.uuid, index=g.index, memory_total_mib=g.memory_total_mib,
                 memory_free_mib=view.memory_free_mib.get(g.uuid), allocated_to=alloc.get(g.uuid),
                 quarantined=g.uuid in view.quarantined, memory_idle_mib=view.memory_idle_mib.get(g.uuid))
        for g in reg.gpus
    )
    pool = reg.pool or "default"
    labels = {"pool": pool, "cluster": reg.cluster, "node": reg.node, "interconnect": reg.interconnect}
    if reg.rack:
        labels["rack"] = reg.rack
    return NodeState(
        name=reg.node,
        cluster=reg.cluster,
        model=node_model(reg),
        interconnect=reg.interconnect,
        gpus=gpus,
        # A suspect, lost or unhealthy node keeps its jobs but takes no new ones.
        schedulable=not view.suspect and (view.condition is None or view.condition.state not in ("lost", "unhealthy")),
        draining=view.condition is not None and view.condition.state == "draining",
        pool=pool,
        labels=labels,
        lease_expires_at=view.lease_expires_at,
    )


def job_request(job_id: str, spec: JobSubmitted, estimate_s: float | None = None) -> JobRequest:
    """The placement core's request for a job (`estimate_s`: what a preemption left of its estimate)."""
    labels = dict(spec.labels)
    pool = labels.pop("pool", None)
    return JobRequest(
        job_id=job_id,
        gpus=spec.gpus,
        gpu_models=tuple(spec.gpu_models),
        min_memory_mib=spec.min_memory_mib,
        workload_class=spec.workload_class,
        team=spec.team,
        priority=spec.priority,
        preemptible=spec.preemptible,
        pool=pool,
        labels=tuple(sorted(labels.items())),
        expected_runtime_s=spec.expected_runtime_s if estimate_s is None else estimate_s,
        # A job that need not sit on one NVLink node may run as a gang across nodes; the service's
        # profile splits only a job larger than any node it may use (see SchedulerSettings.policy_config).
        allow_multi_node=not spec.nvlink and spec.gpus > 1,
        service=spec.service,
        nvlink=spec.nvlink and spec.gpus > 1,
    )


def pending_job(job: JobRecord, seq: int) -> PendingJob:
    request = job_request(job.job_id, job.spec, job.estimate_left_s)
    return PendingJob(request, job.submitted_at.timestamp(), seq, job.preemptions, keeps_checkpoint(job.spec))


def movable(job: JobRecord) -> bool:
    """Whether the queue policy may move the job (stop it, resume it from its checkpoint elsewhere).

    Only a job that resumes from its checkpoint (`resume: checkpoint`, never `restart`, which would
    lose its work) and says it keeps one: it is `preemptible` (it already accepts a stop and a
    resume) or names its own `checkpoint_dir` (every job gets a default one, which proves nothing).
    It must be running (its process started) on one node: a gang is never moved.
    """
    return job.state == "running" and not job.parts and keeps_checkpoint(job.spec)


def keeps_checkpoint(spec: JobSubmitted) -> bool:
    """Whether the job resumes from a checkpoint of its own when stopped (`movable` says when it may be moved)."""
    return spec.resume == "checkpoint" and (spec.preemptible or spec.checkpoint_dir is not None)


def held(job: JobRecord, now: datetime) -> bool:
    """A moved job whose stopped attempt may still run: it is not placed again yet."""
    return job.held_until is not None and now < job.held_until


# How long a job that gave no runtime is assumed to run, by workload class, for backfill reservations
# only (None: indefinitely, e.g. an inference service); one already past it is assumed to end soon.
ASSUMED_RUNTIME_S = {"small": 3600.0, "finetune": 6 * 3600.0, "llm-train": 24 * 3600.0, "inference": None}
OVERDUE_S = 300.0


def assumed_end(job: JobRecord, now: float | None) -> float | None:
    """When a job without an estimate is assumed to end (None: not assumed)."""
    runtime = ASSUMED_RUNTIME_S.get(job.spec.workload_class)
    if job.expected_end is not None or runtime is None:
        return None
    started = (job.started_at or job.placed_at or job.submitted_at).timestamp()
    return max(started + runtime, (now or started) + OVERDUE_S)


def assumed_until(job: JobRecord) -> float:
    """Until when `running_job`'s view of the job holds (epoch s): its assumed end moves with the clock once
    the job is within OVERDUE_S of it (infinity: it never moves)."""
    runtime = ASSUMED_RUNTIME_S.get(job.spec.workload_class)
    if job.expected_end is not None or runtime is None:
        return math.inf
    return (job.started_at or job.placed_at or job.submitted_at).timestamp() + runtime - OVERDUE_S


def running_job(job: JobRecord, cluster: ClusterState | None = None, now: float | None = None) -> RunningJob:
    """The policy's view of an active job; with `cluster`, what moving a movable job needs: its
    request and the speed of the placement it runs on (as the placement core measured it)."""
    started = job.started_at or job.placed_at or job.submitted_at
    request, speed = None, None
    node = cluster.nodes.get(job.node) if cluster is not None and job.node else None
    if cluster is not None and node is not None and node.cluster == job.cluster and movable(job):
        request = job_request(job.job_id, job.spec, job.estimate_left_s)
        speed = candidate_speed(cluster, request, node)
    return RunningJob(
        job_id=job.job_id,
        team=job.spec.team,
        priority=job.spec.priority,
        preemptible=job.spec.preemptible,
        gpus=len(job.gpu_uuids) or job.spec.gpus,
        started_at=started.timestamp(),
        expected_end=job.expected_end,
        assumed_end=assumed_end(job, now),
        preemptions=job.preemptions,
        request=request,
        speed=speed,
        checkpointable=request is not None,
        migrations=job.migrations,
    )


def infeasible_reason(registrations: Iterable[NodeRegistered], req: JobRequest, profile: Profile,
                      idle: Mapping[str, float] | None = None) -> str | None:
    """Why the job could never run on these nodes (all free, all healthy, each GPU offering what `idle` says it
    offers idle, by uuid, else its nameplate), naming the largest node and what it lacks; or None; None too when
    no node is known."""
    nodes = [node_state(NodeView(reg, memory_idle_mib=idle or {}), {}) for reg in registrations]
    if not nodes:
        return None
    decision = place_on(ClusterState(nodes), req, profile, 0.0)
    if not isinstance(decision, Infeasible):
        return None
    return f"{decision.reason}; {largest_lacks(nodes, req)}"


def largest_lacks(nodes: list[NodeState], req: JobRequest) -> str:
    """The largest node the job may use (of its models if any node is; most GPUs, then most memory on an idle
    GPU) and what it lacks for the job, in words."""
    mine = [n for n in nodes if not req.gpu_models or n.model in req.gpu_models] or nodes
    best = max(mine, key=lambda n: (len(n.gpus), max((offers_mib(g) for g in n.gpus), default=0.0)))
    memory = max((offers_mib(g) for g in best.gpus), default=0.0)
    idle = any(g.memory_idle_mib is not None for g in best.gpus)
    what = f"{best.name} ({len(best.gpus)} x {best.model}, {gb(memory)} GB {'free on an idle GPU' if idle else 'each'})"
    lacks = [r for check in STATIC_FILTERS.values() if (r := check(req, best))]  # (a gang: none, it spans nodes)
    return f"the largest node, {what}, lacks: {'; '.join(lacks)}" if lacks else f"the largest node is {what}"
