"""Scheduler service: keeps job records, queues and allocations; places jobs on GPUs.

Consumes job.submitted / started / finished / failed and node.registered;
produces job.placed (through the outbox, so a crash never loses or doubles a
placement). A placement pass runs whenever something changed and every second.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from datetime import datetime
from typing import Literal

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from whaleflux.shared import subjects
from whaleflux.shared.events import (
    Envelope,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    make_envelope,
)
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings
from whaleflux.shared.sizing import SizingError, SizingReport, SizingRequest, estimate, memory_floor_mib

from .placement import GpuState, Infeasible, JobRequest, NodeState, Placement, place

JobStateName = Literal["pending", "placed", "running", "succeeded", "failed", "rejected"]
TERMINAL = {"succeeded", "failed", "rejected"}


class SchedulerSettings(CommonSettings):
    http_port: int = 8702
    pass_interval_s: float = Field(1.0, gt=0)


class JobRecord(BaseModel):
    job_id: str
    spec: JobSubmitted
    state: JobStateName = "pending"
    reason: str | None = None
    attempt: int = 0
    cluster: str | None = None
    node: str | None = None
    gpu_model: str | None = None
    gpu_uuids: list[str] = Field(default_factory=list)
    submitted_at: datetime
    placed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None


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
    sizing: SizingRequest | None = Field(
        None, description="a model and workload instead of min_memory_mib: its estimate for `gpus` GPUs fills that in"
    )

    def job_fields(self) -> dict:
        """The job.submitted fields; min_memory_mib estimated from `sizing` unless given."""
        fields = self.model_dump(exclude={"sizing"})
        if self.sizing is not None and not self.min_memory_mib:
            fields["min_memory_mib"] = math.ceil(memory_floor_mib(self.sizing, self.gpus))
        return fields


class SchedulerService(ServiceBase):
    name = "scheduler"

    def __init__(self, settings: SchedulerSettings, **kw):
        super().__init__(settings, **kw)
        self.settings: SchedulerSettings = settings
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()

    # ---------------------------------------------------------------- state

    def _job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    async def get_job(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.get(self._job_key(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    async def _save(self, job: JobRecord) -> None:
        await self.redis.set(self._job_key(job.job_id), job.model_dump_json())

    async def _nodes(self) -> list[NodeState]:
        raw_nodes = await self.redis.hgetall(f"{self.prefix}:nodes")
        alloc = await self.redis.hgetall(f"{self.prefix}:alloc")
        nodes = []
        for raw in raw_nodes.values():
            reg = NodeRegistered.model_validate_json(raw)
            gpus = tuple(
                GpuState(uuid=g.uuid, index=g.index, memory_total_mib=g.memory_total_mib, allocated_to=alloc.get(g.uuid))
                for g in reg.gpus
            )
            model = reg.gpus[0].model if reg.gpus else "unknown"
            nodes.append(NodeState(name=reg.node, cluster=reg.cluster, model=model, interconnect=reg.interconnect, gpus=gpus))
        return nodes

    # ---------------------------------------------------------------- handlers

    def consumers(self):
        return {"scheduler-jobs": self.on_job_event, "scheduler-nodes": self.on_node_registered}

    async def on_node_registered(self, env: Envelope, data: NodeRegistered) -> None:
        await self.redis.hset(f"{self.prefix}:nodes", f"{data.cluster}/{data.node}", data.model_dump_json())
        self._dirty.set()

    async def on_job_event(self, env: Envelope, data) -> None:
        if isinstance(data, JobSubmitted):
            await self._on_submitted(env, data)
        elif isinstance(data, (JobStarted, JobFinished, JobFailed)):
            await self._on_progress(data)

    async def _on_submitted(self, env: Envelope, data: JobSubmitted) -> None:
        job = JobRecord(job_id=data.job_id, spec=data, submitted_at=env.time)
        # SET NX: a job id submitted twice (or redelivered) is recorded once.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._job_key(job.job_id), job.model_dump_json(), nx=True)
            pipe.zadd(f"{self.prefix}:jobs", {job.job_id: env.time.timestamp()}, nx=True)
            created, _ = await pipe.execute()
        # Queue it if still pending; also repairs a crash between the two writes.
        current = await self.get_job(job.job_id)
        if current is not None and current.state == "pending":
            await self.redis.zadd(f"{self.prefix}:pending", {job.job_id: env.time.timestamp()}, nx=True)
        if created:
            self.log.debug("job.queued", job_id=job.job_id, gpus=data.gpus)
        self._dirty.set()

    async def _on_progress(self, data: JobStarted | JobFinished | JobFailed) -> None:
        job = await self.get_job(data.job_id)
        if job is None or data.attempt != job.attempt:
            self.log.warning("job.progress_ignored", job_id=data.job_id, attempt=data.attempt)
            return
        if isinstance(data, JobStarted):
            if job.state == "placed":
                job.state, job.started_at = "running", data.started_at
                await self._save(job)
            return
        if job.state in TERMINAL:
            return
        if isinstance(data, JobFinished):
            job.state = "succeeded" if data.exit_code == 0 else "failed"
            job.exit_code, job.finished_at = data.exit_code, data.finished_at
            job.started_at = job.started_at or data.started_at
        else:
            job.state, job.reason, job.exit_code, job.finished_at = "failed", data.reason, data.exit_code, data.failed_at
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._job_key(job.job_id), job.model_dump_json())
            for gpu in job.gpu_uuids:
                pipe.hdel(f"{self.prefix}:alloc", gpu)
            await pipe.execute()
        self._dirty.set()

    # ---------------------------------------------------------------- placement

    async def schedule_pass(self) -> int:
        """Try every pending job in submission order; return how many were placed."""
        async with self._lock:
            nodes = await self._nodes()
            pending = await self.redis.zrange(f"{self.prefix}:pending", 0, -1)
            placed, rejected = 0, False
            for job_id in pending:
                job = await self.get_job(job_id)
                if job is None or job.state != "pending":
                    await self.redis.zrem(f"{self.prefix}:pending", job_id)
                    continue
                spec = job.spec
                decision = place(
                    JobRequest(job_id, spec.gpus, tuple(spec.gpu_models), spec.min_memory_mib), nodes
                )
                if isinstance(decision, Placement):
                    await self._commit_placement(job, decision)
                    nodes = _mark_allocated(nodes, decision, job_id)
                    placed += 1
                elif isinstance(decision, Infeasible):
                    await self._reject(job, decision.reason)
                    rejected = True
                elif job.reason != decision.reason:
                    job.reason = decision.reason
                    await self._save(job)
        if placed or rejected:
            await self.publish_staged()
        return placed

    async def _reject(self, job: JobRecord, reason: str) -> None:
        """A job that can never run is rejected with its reason, never queued forever."""
        job.state, job.reason = "rejected", reason
        env = make_envelope(
            JobRejected(job_id=job.job_id, reason=reason),
            source=f"whaleflux/scheduler/{self.settings.instance}",
            subject=job.job_id,
            event_id=f"rejected-{job.job_id}",
            correlation_id=job.job_id,
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._job_key(job.job_id), job.model_dump_json())
            pipe.zrem(f"{self.prefix}:pending", job.job_id)
            self.outbox.stage(pipe, subjects.JOB_REJECTED, env)
            await pipe.execute()
        self.log.info("job.rejected", job_id=job.job_id, reason=reason)

    async def _commit_placement(self, job: JobRecord, p: Placement) -> None:
        job.attempt += 1
        job.state, job.reason, job.placed_at = "placed", None, self.clock()
        job.cluster, job.node, job.gpu_model, job.gpu_uuids = p.cluster, p.node, p.model, list(p.gpu_uuids)
        spec = job.spec
        event = JobPlaced(
            job_id=job.job_id,
            attempt=job.attempt,
            cluster=p.cluster,
            node=p.node,
            gpu_model=p.model,
            gpu_uuids=list(p.gpu_uuids),
            gpu_indices=list(p.gpu_indices),
            command=spec.command,
            env=spec.env,
            workdir=spec.workdir,
            team=spec.team,
            project=spec.project,
        )
        subject = subjects.job_placed(p.cluster, p.node)
        env = make_envelope(
            event,
            source=f"whaleflux/scheduler/{self.settings.instance}",
            subject=job.job_id,
            event_id=f"placed-{job.job_id}-{job.attempt}",
            correlation_id=job.job_id,
            time=job.placed_at,
        )
        # Job state, allocation and the outgoing event commit together or not at all.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._job_key(job.job_id), job.model_dump_json())
            pipe.zrem(f"{self.prefix}:pending", job.job_id)
            for gpu in p.gpu_uuids:
                pipe.hset(f"{self.prefix}:alloc", gpu, job.job_id)
            self.outbox.stage(pipe, subject, env)
            await pipe.execute()
        self.log.info("job.placed", job_id=job.job_id, node=p.node, gpus=list(p.gpu_indices), attempt=job.attempt)

    async def on_ready(self) -> None:
        # Placements committed before a crash but not yet published go out now.
        await self.publish_staged()

    def background(self):
        return [self._placement_loop]

    async def _placement_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), self.settings.pass_interval_s)
            except asyncio.TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self.schedule_pass()
            except Exception as exc:
                self.log.error("placement.pass_failed", error=repr(exc))
                await asyncio.sleep(1.0)

    # ---------------------------------------------------------------- HTTP

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.post("/v1/size", tags=["sizing"])
        def size(body: SizingRequest) -> SizingReport:
            """Memory, time and GPU options for serving or fine-tuning an LLM; bad input gets 422/400 naming the field."""
            return estimate(body)

        @app.exception_handler(SizingError)
        async def sizing_error(request, exc: SizingError) -> JSONResponse:
            return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=400)

        @app.get("/v1/jobs", tags=["jobs"])
        async def list_jobs(limit: int = Query(100, ge=1, le=1000), state: JobStateName | None = None) -> list[JobRecord]:
            """Jobs, newest first (environment values masked)."""
            jobs: list[JobRecord] = []
            start, page = 0, max(limit, 200)
            while len(jobs) < limit:
                ids = await self.redis.zrevrange(f"{self.prefix}:jobs", start, start + page - 1)
                if not ids:
                    break
                start += page
                raws = await self.redis.mget([self._job_key(i) for i in ids])
                jobs += [j for j in (JobRecord.model_validate_json(r) for r in raws if r) if state is None or j.state == state]
            return [_masked(j) for j in jobs[:limit]]

        @app.get("/v1/jobs/{job_id}", tags=["jobs"])
        async def get_job(job_id: str) -> JobRecord:
            """One job (environment values masked)."""
            job = await self.get_job(job_id)
            if job is None:
                raise HTTPException(404, f"job {job_id!r} not found")
            return _masked(job)

        @app.post("/v1/jobs", tags=["jobs"], status_code=202, dependencies=[admin])
        async def submit(body: SubmitRequest) -> dict:
            """Submit a job (publishes job.submitted); needs the bearer token."""
            job_id = uuid.uuid4().hex[:12]
            data = JobSubmitted(job_id=job_id, submitted_by="api", **body.job_fields())
            await self.bus.publish(subjects.JOB_SUBMITTED, data, subject=job_id, correlation_id=job_id)
            return {"job_id": job_id}

        @app.get("/v1/nodes", tags=["nodes"])
        async def nodes() -> list[dict]:
            return [
                {
                    "node": n.name,
                    "cluster": n.cluster,
                    "model": n.model,
                    "gpus": len(n.gpus),
                    "free": sum(1 for g in n.gpus if g.allocated_to is None),
                }
                for n in sorted(await self._nodes(), key=lambda n: n.name)
            ]


def _masked(job: JobRecord) -> JobRecord:
    """A job's environment may carry tokens: read APIs show the names, not the values."""
    if not job.spec.env:
        return job
    spec = job.spec.model_copy(update={"env": {k: "********" for k in job.spec.env}})
    return job.model_copy(update={"spec": spec})


def _mark_allocated(nodes: list[NodeState], p: Placement, job_id: str) -> list[NodeState]:
    taken = set(p.gpu_uuids)
    out = []
    for node in nodes:
        if node.name == p.node:
            gpus = tuple(
                GpuState(g.uuid, g.index, g.memory_total_mib, g.memory_free_mib, job_id if g.uuid in taken else g.allocated_to)
                for g in node.gpus
            )
            node = NodeState(node.name, node.cluster, node.model, node.interconnect, gpus, node.schedulable)
        out.append(node)
    return out


def main() -> None:
    run_service(SchedulerService(SchedulerSettings()))
