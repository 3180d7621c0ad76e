"""The scheduler's HTTP API: jobs (submit, list, show, why, cancel), nodes (list, drain, undrain), GPUs (list,
cordon, uncordon), sizing, leader."""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from whaleflux.shared import job_paths, redaction, subjects
from whaleflux.shared.contracts.jobs import JobWhy
from whaleflux.shared.deps import NowDep, OperatorDep, RuntimeDep, Submitter, ViewerDep, require_team
from whaleflux.shared.envelope import Envelope, encode
from whaleflux.shared.events import JobSubmitted, NodeDrainRequested
from whaleflux.shared.job_events import submitted_event_id
from whaleflux.shared.runtime import BadRequest, Runtime
from whaleflux.shared.sizing import SizingError, SizingReport, SizingRequest, estimate, memory_floor_mib

from . import idempotency as idem
from .failover import Failover
from .feeds import Feeds
from .gpu_health import GpuHealth
from .leadership import NotLeader
from .quarantine import Gpu
from .records import JobRecord, JobStateName
from .schedule_request import NodeView, infeasible_reason, job_request, node_model, node_state
from .service import Scheduler
from .store import SchedulerStore
from .why import reason_key, spoken, why


def _scheduler(request: Request) -> Scheduler:
    return cast(Scheduler, request.app.state.scheduler)


def _store(request: Request) -> SchedulerStore:
    return _scheduler(request).store


def _failover(request: Request) -> Failover:
    return cast(Failover, request.app.state.failover)


def _feeds(request: Request) -> Feeds:
    return cast(Feeds, request.app.state.feeds)


def _health(request: Request) -> GpuHealth:
    return cast(GpuHealth, request.app.state.health)


def _whole_state(scheduler: Annotated[Scheduler, Depends(_scheduler)]) -> None:
    """The leader answers 503 with the reason while its store is down or being rebuilt, never
    from partial state; a standby serves reads from whatever the leader keeps."""
    if scheduler.is_leader:
        scheduler.runtime.require_state()


SchedulerDep = Annotated[Scheduler, Depends(_scheduler)]
StoreDep = Annotated[SchedulerStore, Depends(_store)]
FailoverDep = Annotated[Failover, Depends(_failover)]
FeedsDep = Annotated[Feeds, Depends(_feeds)]
HealthDep = Annotated[GpuHealth, Depends(_health)]
WholeState = Depends(_whole_state)


class SubmitRequest(BaseModel):
    """Body of POST /v1/jobs: a job.submitted payload whose job_id is optional."""

    name: str = Field(min_length=1, max_length=128)
    team: str = "default"
    project: str = "default"
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    gpus: int = Field(1, ge=1, le=1024)
    gpu_models: list[str] = Field(default_factory=list)
    min_memory_mib: float = Field(0, ge=0)
    expected_runtime_s: float | None = Field(None, gt=0)
    workload_class: Literal["llm-train", "finetune", "inference", "small"] = "small"
    priority: Literal["high", "normal", "low"] = "normal"
    preemptible: bool = False
    checkpoint_dir: str | None = None
    resume: Literal["checkpoint", "restart"] = "checkpoint"
    nvlink: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    service: str | None = None
    restart_on_failure: bool = False
    replicas: int = Field(1, ge=1, le=64, description="an inference service: this many jobs, spread across nodes")
    sizing: SizingRequest | None = Field(
        None, description="a model and workload instead of min_memory_mib: its estimate for `gpus` GPUs fills that in"
    )

    def job_fields(self) -> dict:
        """The job.submitted fields; min_memory_mib estimated from `sizing` unless given."""
        fields = self.model_dump(exclude={"sizing", "replicas"})
        if self.sizing is not None and not self.min_memory_mib:
            fields["min_memory_mib"] = math.ceil(memory_floor_mib(self.sizing, self.gpus))
        if self.replicas > 1 and not self.service:
            fields["service"] = self.name if _is_name(self.name) else None
        return fields


def _is_name(text: str) -> bool:
    return bool(text) and all(c.isalnum() or c in "_.-" for c in text)


def replica_ids(base: str, replicas: int) -> list[str]:
    """Job ids of a submission: the id itself, or `<id>-r<i>` for each replica of a service."""
    return [base] if replicas == 1 else [f"{base}-r{i}" for i in range(replicas)]


def _masked(job: JobRecord) -> JobRecord:
    """A job's environment may carry tokens: read APIs show the names, not the values."""
    if not job.spec.env:
        return job
    spec = job.spec.model_copy(update={"env": {k: "********" for k in job.spec.env}})
    return job.model_copy(update={"spec": spec})



class CancelBody(BaseModel):
    reason: str = Field("cancelled by an operator", min_length=1, max_length=500)


class DrainBody(BaseModel):
    reason: str = Field("drained by an operator", min_length=1, max_length=500)


sizing = APIRouter(tags=["sizing"], dependencies=[ViewerDep])
ops = APIRouter(tags=["ops"])
# The role is checked before the state (a request without a token gets 401 whatever the store's state).
jobs = APIRouter(tags=["jobs"], dependencies=[ViewerDep])
nodes = APIRouter(tags=["nodes"], dependencies=[ViewerDep])


@sizing.post("/v1/size")
def size(body: SizingRequest) -> SizingReport:
    """Memory, time and GPU options for serving or fine-tuning an LLM; bad input gets 422/400 naming the field."""
    return estimate(body)


@ops.get("/v1/leader")
async def leader(scheduler: SchedulerDep) -> dict[str, Any]:
    """This replica's role (`leader` or `standby`) and who holds the lease now, with its fencing token."""
    mine = scheduler.leadership if scheduler.connected else None
    holder, token = await mine.current() if mine is not None else (None, None)
    return {
        "role": "leader" if scheduler.is_leader else "standby",
        "me": mine.holder if mine is not None else None,
        "leader": holder,
        "token": token,
    }


@jobs.get("/v1/jobs", dependencies=[WholeState])
async def list_jobs(store: StoreDep, now: NowDep, limit: int = Query(100, ge=1, le=1000),
                    state: JobStateName | None = None) -> list[JobRecord]:
    """Jobs, newest first (environment values masked)."""
    found: list[JobRecord] = []
    start, page = 0, max(limit, 200)
    while len(found) < limit:
        ids = await store.newest_job_ids(start, page)
        if not ids:
            break
        start += page
        records = await store.jobs(ids)
        found += [records[i] for i in ids if i in records and (state is None or records[i].state == state)]
    return [_spoken(_masked(j), now) for j in await store.with_waiting(found[:limit])]


async def _job(store: SchedulerStore, job_id: str) -> JobRecord:
    job = await store.job(job_id)
    if job is None:
        raise HTTPException(404, f"job {job_id!r} not found")
    [job] = await store.with_waiting([job])
    return job


def _spoken(job: JobRecord, now: datetime) -> JobRecord:
    """The job with its reason as a person reads it now (moments in local time, how far off)."""
    if not job.reason:
        return job
    said = spoken(job.reason, now)
    return job if said == job.reason else job.model_copy(update={"reason": said})


@jobs.get("/v1/jobs/{job_id}", dependencies=[WholeState])
async def get_job(job_id: str, store: StoreDep, now: NowDep) -> JobRecord:
    """One job (environment values masked)."""
    return _spoken(_masked(await _job(store, job_id)), now)


class RedactBody(BaseModel):
    text: str = Field(max_length=256 * 1024, description="text the job wrote (its log's tail)")


@jobs.post("/v1/jobs/{job_id}/redact", dependencies=[WholeState])
async def redact_text(job_id: str, body: RedactBody, store: StoreDep) -> dict[str, str]:
    """The text with the job's secrets masked as its job.finished log lines are (shared/redaction.py): the values
    of its secret-named variables, which only the scheduler keeps, and secret-looking assignments. What the
    console shows of a job's log to any viewer. Reads only."""
    job = await _job(store, job_id)
    return {"text": redaction.redact(body.text, redaction.secret_values(job.spec.env))}


@jobs.get("/v1/jobs/{job_id}/why", dependencies=[WholeState])
async def job_why(job_id: str, store: StoreDep, health: HealthDep, now: NowDep) -> JobWhy:
    """Why the job waits (what it needs, the largest free block, jobs ahead, the quarantined GPUs of the models it
    may use), or where and why it runs (and which of its GPUs are quarantined); moments in the scheduler's local
    time and how far off they are. `why_key` changes when the reason does, not when only the clock moves on."""
    job = await _job(store, job_id)
    quarantined = list((await health.quarantined()).values())
    models = {r.node: node_model(r) for r in (await store.registrations()).values()}
    text = why(job, quarantined, models)
    return JobWhy(job_id=job_id, state=job.state, attempt=job.attempt, why=spoken(text, now), why_key=reason_key(text))


@jobs.post("/v1/jobs", status_code=202, dependencies=[WholeState])
async def submit(body: SubmitRequest, caller: Submitter, scheduler: SchedulerDep, feeds: FeedsDep,
                 runtime: RuntimeDep, response: Response, idempotency_key: Annotated[str | None, Header(
                     alias=idem.HEADER, description="a repeat with the same key (within 24 h) answers the first "
                     "request's jobs, with `Idempotent-Replayed: true`; with another body 422")] = None,
                 ) -> dict[str, Any]:
    """Submit a job (publishes job.submitted): a submitter for the job's team (403 naming the team otherwise),
    an operator or admin for any. 422 with the reason if it can never run, 413 if it is too large for the bus.
    Answered only once JetStream has stored every job.submitted; a 503 may leave them on their way, so a
    client retries with the same `Idempotency-Key` to get the same jobs, never copies."""
    require_team(caller, body.team)
    if idempotency_key is not None and (problem := idem.key_problem(idempotency_key)):
        raise HTTPException(422, problem)
    digest = idem.key_digest(idempotency_key, caller.name) if idempotency_key is not None else None
    print_ = idem.fingerprint(body.model_dump(mode="json"))
    claim = await scheduler.store.claimed(digest) if digest is not None else None
    if claim is None:
        base = idem.job_id_for(digest) if digest is not None else uuid.uuid4().hex[:12]
        submitted = _submissions(body, replica_ids(base, body.replicas))
        _own_paths(scheduler, submitted[0])
        reason = await _never_fits(scheduler, feeds, submitted[0])
        if reason:
            raise HTTPException(422, f"infeasible: {reason}")
        envs = _envelopes(runtime, submitted)
        mine = idem.Claim(fingerprint=print_, job_ids=[j.job_id for j in submitted])
        if digest is None or (claim := await scheduler.store.claim(digest, mine)) is None:
            await _publish(runtime, body.team, envs)
            if digest is not None:
                await scheduler.store.mark_durable(digest, mine)
            return _answer(mine.job_ids)
    # The key was used before (or meanwhile, by a request that raced this one).
    if idem.verdict(claim, print_) is idem.Verdict.CONFLICT:
        raise HTTPException(422, idem.conflict_detail(claim))
    response.headers[idem.REPLAYED_HEADER] = "true"
    if not claim.durable and digest is not None:
        # Its first publish went unacknowledged (stored or not, nobody knows): the very same events again.
        await _publish(runtime, body.team, _envelopes(runtime, _submissions(body, claim.job_ids)))
        await scheduler.store.mark_durable(digest, claim)
    return _answer(claim.job_ids)


def _submissions(body: SubmitRequest, job_ids: list[str]) -> list[JobSubmitted]:
    """The job.submitted of each of the submission's jobs; 400 if the body makes no valid job."""
    fields = body.job_fields()
    try:
        submitted = [JobSubmitted(job_id=i, submitted_by="api", **fields) for i in job_ids]
        subjects.job_submitted(body.team)  # a team that is no subject (`a..b`) is refused here
    except ValueError as exc:  # a ValidationError, or that
        raise BadRequest(str(exc)) from exc
    return submitted


def _envelopes(runtime: Runtime, submitted: list[JobSubmitted]) -> list[Envelope]:
    """Each job.submitted in its envelope, under its fixed event id; 413 if one is larger than the bus carries
    (the request's body limit is larger than the bus's message limit)."""
    envs = [runtime.envelope(d, subject=d.job_id, event_id=submitted_event_id(d.job_id), correlation_id=d.job_id)
            for d in submitted]
    size, limit = max(len(encode(e)) for e in envs), runtime.bus.nc.max_payload
    if size > limit:
        raise HTTPException(413, f"request body: the job is {size} bytes as an event, over the bus's limit of "
                                 f"{limit} bytes (a large `env` or `command`?)")
    return envs


async def _publish(runtime: Runtime, team: str, envs: list[Envelope]) -> None:
    """Returns once JetStream has stored every one (a re-publish of one is a duplicate it drops)."""
    for env in envs:
        await runtime.bus.publish_envelope(subjects.job_submitted(team), env)


def _answer(job_ids: list[str]) -> dict[str, Any]:
    return {"job_id": job_ids[0], "job_ids": job_ids}


@jobs.post("/v1/jobs/check", dependencies=[WholeState])
async def check(body: SubmitRequest, scheduler: SchedulerDep, feeds: FeedsDep) -> dict[str, Any]:
    """Whether the fleet could ever run the job (`whaleflux submit` asks before it publishes): `feasible`, and
    the reason when it is not. Reads only: a viewer's token in production."""
    try:
        job = JobSubmitted(job_id="check", submitted_by="api", **body.job_fields())
    except ValidationError as exc:
        raise BadRequest(str(exc)) from exc
    _own_paths(scheduler, job)
    reason = await _never_fits(scheduler, feeds, job)
    return {"feasible": reason is None, "reason": reason}


def _own_paths(scheduler: Scheduler, job: JobSubmitted) -> None:
    """400 naming the field when a folder the job names is not its own (shared/job_paths.py)."""
    refused = job_paths.refusals(job.model_dump(), job.team, scheduler.settings.team_roots)
    if refused:
        raise BadRequest("; ".join(f"{field}: {reason}" for field, reason in refused.items()))


async def _never_fits(scheduler: Scheduler, feeds: Feeds, job: JobSubmitted) -> str | None:
    """Why no registered node, all free and healthy, could ever hold the job (each GPU offering what telemetry saw
    it offer idle, else its nameplate); None if one could."""
    regs = await scheduler.store.registrations()
    return infeasible_reason(regs.values(), job_request(job.job_id, job), scheduler.policy.profile,
                             feeds.idle_free())


@jobs.post("/v1/jobs/{job_id}/cancel", dependencies=[WholeState])
async def cancel(job_id: str, caller: Submitter, scheduler: SchedulerDep,
                 body: CancelBody | None = None) -> dict[str, Any]:
    """Cancel a job: a pending one leaves the queue; a placed or running one is told to stop on its nodes (SIGTERM,
    grace, SIGKILL) and ends `cancelled`, never placed again. 404 unknown, 409 if it has ended already."""
    reason = (body or CancelBody()).reason
    async with scheduler.lock:
        job = await scheduler.store.job(job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id!r} not found")
        require_team(caller, job.spec.team)
        was, nodes = job.state, job.nodes if job.state in ("placed", "running") else []
        if not await scheduler.store.cancel(job, reason, "api", scheduler.settings.preemption_grace_s,
                                            scheduler.clock()):
            raise HTTPException(409, f"job {job_id!r} has ended already: {job.state}")
    await scheduler.publish_staged()
    scheduler.dirty.set()
    scheduler.log.info("job.cancelled", job_id=job_id, was=was, attempt=job.attempt, stopping=nodes)
    return {"job_id": job_id, "state": job.state, "was": was, "attempt": job.attempt, "stopping": nodes}


@nodes.get("/v1/nodes", dependencies=[WholeState])
async def list_nodes(store: StoreDep, failover: FailoverDep, feeds: FeedsDep, health: HealthDep,
                     now: NowDep) -> list[dict[str, Any]]:
    """Registered nodes: model, GPUs, free GPUs (not quarantined), quarantined GPUs (indices) and status (healthy,
    suspect, lost, draining, unhealthy: its agent says why)."""
    regs = await store.registrations()
    conditions = await store.conditions()
    alloc = await store.alloc()
    seen = await store.last_seen()
    quarantined = frozenset(await health.quarantined())
    at = now.timestamp()
    measured = feeds.measured_free()
    out = []
    for key, reg in sorted(regs.items(), key=lambda kv: kv[1].node):
        view = NodeView(reg, conditions.get(key), key in failover.suspects, quarantined=quarantined)
        n = node_state(view, alloc)
        cond = view.condition.state if view.condition else None
        out.append({
            "node": n.name, "cluster": n.cluster, "model": n.model, "gpus": len(n.gpus),
            # As `/v1/gpus` counts them (`gpu_status`): a draining node has no free GPU, it has draining ones.
            "free": sum(1 for g in n.gpus if gpu_status(g.quarantined, g.allocated_to is not None, cond) == "free"),
            "draining": sum(1 for g in n.gpus
                            if gpu_status(g.quarantined, g.allocated_to is not None, cond) == "draining"),
            "quarantined": [g.index for g in n.gpus if g.quarantined], "status": view.status,
            "reason": view.condition.reason if view.condition else None,
            "heartbeat_age_s": round(at - seen[key], 1) if key in seen else None,
            # What telemetry says is free on each GPU (in index order; None: no recent sample).
            "memory_free_mib": [round(measured[g.uuid]) if g.uuid in measured else None for g in reg.gpus],
            # When its lease ends, as inventory says (None: owned, auto-renewing, or not heard yet).
            "lease_ends_at": feeds.leases.get(reg.node),
        })
    return out


async def _node_key(store: SchedulerStore, node: str) -> str:
    regs = await store.registrations()
    matches = [k for k, r in regs.items() if r.node == node or k == node]
    if len(matches) != 1:
        problem = "not registered" if not matches else f"is ambiguous: {matches}"
        raise HTTPException(404, f"node {node!r} {problem}")
    return matches[0]


@nodes.post("/v1/nodes/{node}/drain", status_code=202, dependencies=[OperatorDep, WholeState])
async def drain(node: str, store: StoreDep, runtime: RuntimeDep, body: DrainBody | None = None) -> dict[str, Any]:
    """Publish node.drain_requested: no new work on the node, its jobs stopped and requeued."""
    reg = (await store.registrations())[await _node_key(store, node)]
    reason = (body or DrainBody()).reason
    data = NodeDrainRequested(cluster=reg.cluster, node=reg.node, reason=reason)
    env = runtime.envelope(data, subject=reg.node)
    await runtime.bus.publish_envelope(subjects.node_drain_requested(reg.cluster, reg.node), env)
    return {"node": reg.node, "draining": True}


class UndrainBody(BaseModel):
    force: bool = Field(False, description="also uncordon the node's GPUs that are out because a critical alert "
                                           "fires on them")


class StaysOut(BaseModel):
    """A GPU of an undrained node that still takes no work, and why."""

    gpu: int
    cause: str
    reason: str


def undrain_said(node: str, undrained: bool, stays: list[StaysOut], lifted: list[int]) -> str:
    """What an undrain did, in one line: "h100-01 undrained; GPU 3 stays cordoned: GPUTemperatureHigh firing"."""
    parts = [f"{node} undrained" if undrained else f"{node} was not draining"]
    parts += [f"GPU {i} uncordoned (forced)" for i in lifted]
    parts += [f"GPU {s.gpu} stays cordoned: " + (s.reason if s.cause == "alert" else f"{s.cause}: {s.reason}")
              for s in stays]
    return "; ".join(parts)


@nodes.post("/v1/nodes/{node}/undrain", dependencies=[OperatorDep, WholeState])
async def undrain(node: str, store: StoreDep, failover: FailoverDep, health: HealthDep,
                  body: UndrainBody | None = None) -> dict[str, Any]:
    """Let a drained node take work again (`undrained` false if it was not draining). Its GPUs with a firing
    critical alert stay cordoned (`stays_cordoned`, with the operator's cordons and faults' quarantines) unless
    `force`, which uncordons those (`uncordoned`); `said` puts it in words for a person."""
    key = await _node_key(store, node)
    reg = (await store.registrations())[key]
    undrained = await failover.undrain(key)
    force = (body or UndrainBody()).force
    stays: list[StaysOut] = []
    lifted: list[int] = []
    for q in sorted((await health.quarantined()).values(), key=lambda q: q.index):
        if q.node_key != key:
            continue
        if force and q.cause == "alert":
            await health.uncordon(Gpu(q.cluster, q.node, q.uuid, q.index))
            lifted.append(q.index)
        else:
            stays.append(StaysOut(gpu=q.index, cause=q.cause, reason=q.reason))
    return {"node": reg.node, "undrained": undrained, "stays_cordoned": [s.model_dump() for s in stays],
            "uncordoned": lifted, "said": undrain_said(reg.node, undrained, stays, lifted)}


class CordonBody(BaseModel):
    reason: str = Field("cordoned by an operator", min_length=1, max_length=500)


GpuStatus = Literal["free", "allocated", "quarantined", "draining", "unavailable"]


class GpuRow(BaseModel):
    """One registered GPU as the scheduler sees it (GET /v1/gpus)."""

    node: str
    cluster: str
    index: int
    uuid: str
    model: str
    status: GpuStatus
    job_id: str | None = Field(None, description="the job holding it (a quarantined GPU may still hold one)")
    cause: str | None = Field(None, description="why it is quarantined: operator, xid, ecc, missing or alert")
    reason: str | None = None
    since: datetime | None = None
    healthy_since: datetime | None = Field(None, description="a fault's quarantine: healthy since (the hold runs)")


gpus = APIRouter(tags=["gpus"], dependencies=[ViewerDep])


def gpu_status(quarantined: bool, allocated: bool, node_condition: str | None) -> GpuStatus:
    """One word per GPU, the same on every surface (`gpus list`, the console, inventory, findings): quarantined
    first, then allocated, then what its node's condition makes it (draining; unavailable: lost or unhealthy);
    free only when it could take work now."""
    if quarantined:
        return "quarantined"
    if allocated:
        return "allocated"
    if node_condition == "draining":
        return "draining"
    return "unavailable" if node_condition else "free"


@gpus.get("/v1/gpus", dependencies=[WholeState])
async def list_gpus(store: StoreDep, health: HealthDep, status: GpuStatus | None = None) -> list[GpuRow]:
    """Every registered GPU: free, allocated, quarantined (why, since when), draining (its node drains) or
    unavailable (its node is lost or unhealthy); `status` keeps one kind."""
    regs = await store.registrations()
    alloc = await store.alloc()
    conditions = await store.conditions()
    quarantined = await health.quarantined()
    rows = []
    for key, reg in sorted(regs.items(), key=lambda kv: (kv[1].node, kv[1].cluster)):
        model = node_model(reg)
        condition = conditions.get(key)
        for g in sorted(reg.gpus, key=lambda g: g.index):
            q = quarantined.get(g.uuid)
            state = gpu_status(q is not None, g.uuid in alloc, condition.state if condition else None)
            if status is not None and state != status:
                continue
            rows.append(GpuRow(node=reg.node, cluster=reg.cluster, index=g.index, uuid=g.uuid, model=model,
                               status=state, job_id=alloc.get(g.uuid), cause=q.cause if q else None,
                               reason=q.reason if q else None, since=q.since if q else None,
                               healthy_since=q.healthy_since if q else None))
    return rows


async def _gpu(store: SchedulerStore, node: str, gpu: str) -> Gpu:
    """A registered GPU by node name and GPU index (or uuid); 404 naming what is not known."""
    reg = (await store.registrations())[await _node_key(store, node)]
    for g in reg.gpus:
        if str(g.index) == gpu or g.uuid == gpu:
            return Gpu(reg.cluster, reg.node, g.uuid, g.index)
    raise HTTPException(404, f"gpu {gpu!r} not on node {reg.node!r} (indices {sorted(g.index for g in reg.gpus)})")


@gpus.post("/v1/nodes/{node}/gpus/{gpu}/cordon", dependencies=[OperatorDep, WholeState])
async def cordon_gpu(node: str, gpu: str, store: StoreDep, health: HealthDep,
                     body: CordonBody | None = None) -> dict[str, Any]:
    """Take one GPU (index or uuid) out of placement until an operator uncordons it (gpu.cordoned). A job on it
    runs on; undraining its node does not hand it back."""
    target = await _gpu(store, node, gpu)
    record = await health.cordon(target, (body or CordonBody()).reason)
    return {"node": target.node, "gpu": target.index, "uuid": target.uuid, "cordoned": True, "cause": record.cause,
            "reason": record.reason}


@gpus.post("/v1/nodes/{node}/gpus/{gpu}/uncordon", dependencies=[OperatorDep, WholeState])
async def uncordon_gpu(node: str, gpu: str, store: StoreDep, health: HealthDep) -> dict[str, Any]:
    """Let a cordoned or quarantined GPU take work again (gpu.uncordoned); the ECC errors it has now are accepted,
    only more quarantine it again. `uncordoned` is false if it was not out."""
    target = await _gpu(store, node, gpu)
    lifted = await health.uncordon(target)
    return {"node": target.node, "gpu": target.index, "uuid": target.uuid, "uncordoned": lifted is not None,
            "was": lifted.cause if lifted else None}


async def _sizing_error(request: Request, exc: SizingError) -> Response:
    return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=400)


async def _not_leader(request: Request, exc: NotLeader) -> Response:
    return JSONResponse({"detail": f"this scheduler replica is not the leader: {exc}"}, status_code=503)


ROUTERS = [sizing, ops, jobs, nodes, gpus]
EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[Response]]] = {
    SizingError: _sizing_error,
    NotLeader: _not_leader,
}
