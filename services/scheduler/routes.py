"""The scheduler's HTTP API: jobs (submit, list, show, why), nodes (list, drain, undrain), sizing."""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Literal

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from whaleflux.shared import subjects
from whaleflux.shared.events import JobSubmitted, NodeDrainRequested
from whaleflux.shared.sizing import SizingError, SizingReport, SizingRequest, estimate, memory_floor_mib

from .leadership import NotLeader
from .records import JobRecord, JobStateName
from .schedule_request import NodeView, infeasible_reason, job_request, node_state

if TYPE_CHECKING:
    from .app import SchedulerService


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


def why(job: JobRecord) -> str:
    """Why the job is where it is, in words."""
    lines = []
    if job.state == "pending":
        lines.append(f"waiting: {job.reason or 'not yet considered by a placement pass'}")
    elif job.state in ("placed", "running") and job.parts:
        lines.append(f"{job.state} as a gang on {len(job.parts)} nodes, attempt {job.attempt}:")
        lines += [f"  rank {p.rank}: {p.node} ({p.gpu_model}), {p.state}, GPUs {', '.join(p.gpu_uuids)}" for p in job.parts]
        if job.placed_because:
            lines.append(f"placed there because: {job.placed_because}")
    elif job.state in ("placed", "running"):
        lines.append(f"{job.state} on {job.node} ({job.gpu_model}), attempt {job.attempt}, GPUs {', '.join(job.gpu_uuids)}")
        if job.placed_because:
            lines.append(f"placed there because: {job.placed_because}")
    elif job.state == "rejected":
        lines.append(f"rejected: {job.reason}")
    else:
        end = f"exit code {job.exit_code}" if job.exit_code is not None else (job.reason or "")
        if job.parts and job.reason and job.exit_code is not None:
            end += f" ({job.reason})"
        where = f" on {', '.join(job.nodes)}" if job.parts else ""
        lines.append(f"{job.state} after attempt {job.attempt}{where}: {end}")
    lines += [f"requeued: {r}" for r in job.requeues]
    return "\n".join(lines)


def _masked(job: JobRecord) -> JobRecord:
    """A job's environment may carry tokens: read APIs show the names, not the values."""
    if not job.spec.env:
        return job
    spec = job.spec.model_copy(update={"env": {k: "********" for k in job.spec.env}})
    return job.model_copy(update={"spec": spec})


def add_routes(svc: "SchedulerService", app: FastAPI, admin) -> None:
    def whole_state() -> None:
        # The leader answers 503 with the reason while its store is down or being rebuilt, never
        # from partial state; a standby serves reads from whatever the leader keeps.
        if svc.leadership is not None and svc.leadership.is_leader:
            svc.require_state()

    state = Depends(whole_state)

    @app.post("/v1/size", tags=["sizing"])
    def size(body: SizingRequest) -> SizingReport:
        """Memory, time and GPU options for serving or fine-tuning an LLM; bad input gets 422/400 naming the field."""
        return estimate(body)

    @app.exception_handler(SizingError)
    async def sizing_error(request, exc: SizingError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=400)

    @app.exception_handler(NotLeader)
    async def not_leader(request, exc: NotLeader) -> JSONResponse:
        return JSONResponse({"detail": f"this scheduler replica is not the leader: {exc}"}, status_code=503)

    @app.get("/v1/leader", tags=["ops"])
    async def leader() -> dict:
        """This replica's role (`leader` or `standby`) and who holds the lease now, with its fencing token."""
        mine = svc.leadership
        holder, token = await mine.current() if mine is not None else (None, None)
        return {
            "role": "leader" if mine is not None and mine.is_leader else "standby",
            "me": mine.holder if mine is not None else None,
            "leader": holder,
            "token": token,
        }

    @app.get("/v1/jobs", tags=["jobs"], dependencies=[state])
    async def list_jobs(limit: int = Query(100, ge=1, le=1000), state: JobStateName | None = None) -> list[JobRecord]:
        """Jobs, newest first (environment values masked)."""
        jobs: list[JobRecord] = []
        start, page = 0, max(limit, 200)
        while len(jobs) < limit:
            ids = await svc.redis.zrevrange(f"{svc.prefix}:jobs", start, start + page - 1)
            if not ids:
                break
            start += page
            found = await svc.store.jobs(ids)
            jobs += [found[i] for i in ids if i in found and (state is None or found[i].state == state)]
        return [_masked(j) for j in await svc.store.with_waiting(jobs[:limit])]

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], dependencies=[state])
    async def get_job(job_id: str) -> JobRecord:
        """One job (environment values masked)."""
        job = await svc.store.job(job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id!r} not found")
        return _masked((await svc.store.with_waiting([job]))[0])

    @app.get("/v1/jobs/{job_id}/why", tags=["jobs"], dependencies=[state])
    async def job_why(job_id: str) -> dict:
        """Why the job waits (what it needs, the largest free block, jobs ahead), or where and why it runs."""
        job = await svc.store.job(job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id!r} not found")
        [job] = await svc.store.with_waiting([job])
        return {"job_id": job_id, "state": job.state, "attempt": job.attempt, "why": why(job)}

    @app.post("/v1/jobs", tags=["jobs"], status_code=202, dependencies=[admin, state])
    async def submit(body: SubmitRequest) -> dict:
        """Submit a job (publishes job.submitted); needs the bearer token. 422 with the reason if it can never run."""
        base = uuid.uuid4().hex[:12]
        fields = body.job_fields()
        jobs = [JobSubmitted(job_id=i, submitted_by="api", **fields) for i in replica_ids(base, body.replicas)]
        # Judged against the registered nodes, all free: a job no node could ever hold is refused now.
        reason = infeasible_reason((await svc.store.registrations()).values(), job_request(base, jobs[0]), svc.policy.profile)
        if reason:
            raise HTTPException(422, f"infeasible: {reason}")
        for data in jobs:
            await svc.bus.publish(subjects.JOB_SUBMITTED, data, subject=data.job_id, correlation_id=data.job_id)
        return {"job_id": jobs[0].job_id, "job_ids": [j.job_id for j in jobs]}

    @app.get("/v1/nodes", tags=["nodes"], dependencies=[state])
    async def nodes() -> list[dict]:
        """Registered nodes: model, GPUs, free GPUs and status (healthy, suspect, lost, draining)."""
        regs = await svc.store.registrations()
        conditions = await svc.store.conditions()
        alloc = await svc.store.alloc()
        seen = await svc.store.last_seen()
        now = svc.clock().timestamp()
        measured = svc.measured_free()
        out = []
        for key, reg in sorted(regs.items(), key=lambda kv: kv[1].node):
            view = NodeView(reg, conditions.get(key), key in svc._suspects)
            n = node_state(view, alloc)
            out.append({
                "node": n.name, "cluster": n.cluster, "model": n.model, "gpus": len(n.gpus),
                "free": sum(1 for g in n.gpus if g.allocated_to is None), "status": view.status,
                "reason": view.condition.reason if view.condition else None,
                "heartbeat_age_s": round(now - seen[key], 1) if key in seen else None,
                # What telemetry says is free on each GPU (in index order; None: no recent sample).
                "memory_free_mib": [round(measured[g.uuid]) if g.uuid in measured else None for g in reg.gpus],
                # When its lease ends, as inventory says (None: owned, auto-renewing, or not heard yet).
                "lease_ends_at": svc._leases.get(reg.node),
            })
        return out

    async def _node_key(node: str) -> str:
        regs = await svc.store.registrations()
        matches = [k for k, r in regs.items() if r.node == node or k == node]
        if len(matches) != 1:
            raise HTTPException(404, f"node {node!r} not registered" if not matches else f"node {node!r} is ambiguous: {matches}")
        return matches[0]

    class DrainBody(BaseModel):
        reason: str = Field("drained by an operator", min_length=1, max_length=500)

    @app.post("/v1/nodes/{node}/drain", tags=["nodes"], status_code=202, dependencies=[admin, state])
    async def drain(node: str, body: DrainBody | None = None) -> dict:
        """Publish node.drain_requested: no new work on the node, its jobs stopped and requeued."""
        reg = (await svc.store.registrations())[await _node_key(node)]
        reason = (body or DrainBody()).reason
        data = NodeDrainRequested(cluster=reg.cluster, node=reg.node, reason=reason)
        await svc.bus.publish(subjects.node_drain_requested(reg.cluster, reg.node), data, subject=reg.node)
        return {"node": reg.node, "draining": True}

    @app.post("/v1/nodes/{node}/undrain", tags=["nodes"], dependencies=[admin, state])
    async def undrain(node: str) -> dict:
        """Let a drained node take work again."""
        return {"node": node, "undrained": await svc.undrain(await _node_key(node))}
