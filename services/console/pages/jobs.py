"""Jobs: the list with filters, the submit form (with a sizing estimate beside it), a job's page with cancel."""

from __future__ import annotations

import shlex
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, Field, ValidationError

from whaleflux.shared import money
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.contracts.jobs import ENDED, JOB_STATES, JobRecord, JobWhy
from whaleflux.shared.job_events import default_name
from whaleflux.shared.localconfig import home

from ..joblog import log_tail
from ..live import Frames
from ..models import AttemptCost
from ..upstream import UpstreamError, fetch_all
from ..web import Console, ConsoleDep, CsrfDep, SessionDep, fragment, page, sse

router = APIRouter()
STATES = list(JOB_STATES)
LIST_LIMIT = 500


class JobFilters(BaseModel):
    state: str = ""
    team: str = ""
    project: str = ""
    model: str = ""

    def keep(self, job: JobRecord) -> bool:
        return ((not self.team or job.spec.team == self.team) and (not self.project or job.spec.project == self.project)
                and (not self.model or job.gpu_model == self.model or self.model in job.spec.gpu_models))

    def key(self) -> str:
        return urlencode({k: v for k, v in self.model_dump().items() if v})


class SubmitForm(BaseModel):
    """The submit form's fields; becomes the body of the scheduler's POST /v1/jobs."""

    command: str = Field(min_length=1)
    name: str = ""
    gpus: int = Field(1, ge=1, le=1024)
    model: str = ""
    min_memory_gb: float = Field(0, ge=0)
    workload_class: Literal["llm-train", "finetune", "inference", "small"] = "small"
    priority: Literal["high", "normal", "low"] = "normal"
    team: str = "default"
    project: str = "default"
    preemptible: bool = False
    checkpoint_dir: str = ""
    labels: str = ""
    size_model: str = ""
    size_task: str = "serve"
    size_context: int = Field(4096, ge=1)
    use_sizing: bool = False

    def body(self) -> dict:
        argv = shlex.split(self.command)
        labels = dict(part.split("=", 1) for part in self.labels.replace(",", " ").split() if "=" in part)
        body = {
            "name": self.name or default_name(argv), "command": argv, "gpus": self.gpus,
            "gpu_models": [self.model] if self.model else [], "workload_class": self.workload_class,
            "priority": self.priority, "team": self.team or "default", "project": self.project or "default",
            "preemptible": self.preemptible, "labels": labels,
        }
        if self.checkpoint_dir:
            body["checkpoint_dir"] = self.checkpoint_dir
        if self.use_sizing and self.size_model:
            body["sizing"] = {"model": self.size_model, "task": self.size_task, "context": self.size_context}
        elif self.min_memory_gb:
            body["min_memory_mib"] = self.min_memory_gb * 1024
        return body


async def job_list(c: Console, filters: JobFilters) -> tuple[list[JobRecord], str | None]:
    try:
        jobs = await c.upstream.get_as(list[JobRecord], "scheduler", "/v1/jobs", limit=LIST_LIMIT,
                                       state=filters.state or None)
    except UpstreamError as exc:
        return [], str(exc)
    return [j for j in jobs if filters.keep(j)], None


def form_context(form: SubmitForm | None = None, error: str | None = None) -> dict:
    from whaleflux.shared.sizing.architectures import catalogue_names

    return {"form": form or SubmitForm(command="python -c \"print('hi')\""), "error": error,
            "gpu_model_names": sorted(gpu_models()), "size_models": catalogue_names(),
            "classes": ["small", "inference", "finetune", "llm-train"], "priorities": ["high", "normal", "low"]}


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(request: Request, c: ConsoleDep, _: SessionDep, state: str = "", team: str = "", project: str = "",
               model: str = "") -> Response:
    filters = JobFilters(state=state, team=team, project=project, model=model)
    rows, error = await job_list(c, filters)
    return page(request, "jobs.html", "jobs", f=filters, states=STATES, models=sorted(gpu_models()),
                live=fragment("_jobs_table.html", jobs=rows, error=error), live_key=filters.key(), **form_context())


@router.get("/live/jobs")
async def jobs_live(c: ConsoleDep, _: SessionDep, state: str = "", team: str = "", project: str = "",
                    model: str = "") -> Response:
    filters = JobFilters(state=state, team=team, project=project, model=model)

    async def render() -> Frames:
        rows, error = await job_list(c, filters)
        return [("jobs", fragment("_jobs_table.html", jobs=rows, error=error))]

    return sse(c.hub.stream(f"jobs?{filters.key()}", {"job"}, render))


@router.post("/jobs")
async def submit(request: Request, c: ConsoleDep, sess: CsrfDep) -> Response:
    raw: dict[str, Any] = {k: v for k, v in (await request.form()).items() if k != "csrf"}
    for box in ("preemptible", "use_sizing"):
        raw[box] = box in raw
    try:
        form = SubmitForm.model_validate(raw)
        body = form.body()
    except (ValidationError, ValueError) as exc:
        return _form_error(request, SubmitForm.model_construct(**raw), _words(exc))
    try:
        done = await c.upstream.post("scheduler", "/v1/jobs", body)
    except UpstreamError as exc:
        return _form_error(request, form, exc.detail)
    c.hub.mark("job")
    return RedirectResponse(f"/jobs/{done['job_id']}", status_code=303)


def _form_error(request: Request, form: SubmitForm, error: str) -> Response:
    return page(request, "submit.html", "jobs", status_code=422, **form_context(form, error))


def _words(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return str(exc)


@router.get("/jobs/new", response_class=HTMLResponse)
async def submit_form(request: Request, _: SessionDep) -> Response:
    return page(request, "submit.html", "jobs", **form_context())


async def job_view(c: Console, job_id: str) -> dict:
    values, errors = await fetch_all({
        "job": c.upstream.get_as(JobRecord, "scheduler", f"/v1/jobs/{job_id}"),
        "why": c.upstream.get_as(JobWhy, "scheduler", f"/v1/jobs/{job_id}/why"),
        "costs": c.upstream.get_as(list[AttemptCost], "billing", f"/v1/costs/jobs/{job_id}"),
    })
    job: JobRecord | None = values["job"]
    # No charge yet is billing's 404, and a job just submitted is not recorded yet (scheduler 404): neither is
    # an error worth showing; the live view fills in as they arrive.
    errors = [e for e in errors if not e.startswith(("billing: 404", "scheduler: 404"))]
    tail = log_tail(home(), job_id, job.attempt) if job and job.attempt else None
    if tail:
        # Masked by the scheduler, which keeps the job's secrets: what a viewer may see of it. Unmasked, never.
        try:
            tail = (await c.upstream.post("scheduler", f"/v1/jobs/{job_id}/redact", {"text": tail}))["text"]
        except UpstreamError as exc:
            tail = None
            errors.append(f"log hidden until its secrets can be masked: {exc}")
    # The job's cost as the CLI and the API show it (shared/money.py): one figure, a running job's marked.
    total = money.job_cost([a.model_dump(mode="json") for a in values["costs"] or []])
    return {"job": job, "why": values["why"], "costs": values["costs"] or [], "cost_total": total, "log": tail,
            "errors": errors, "job_id": job_id, "ended": bool(job and job.state in ENDED)}


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: str, c: ConsoleDep, _: SessionDep) -> Response:
    view = await job_view(c, job_id)
    return page(request, "job.html", "jobs", job_id=job_id,
                live=fragment("_job_live.html", **view))


@router.post("/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def cancel(job_id: str, c: ConsoleDep, _: CsrfDep) -> Response:
    """Cancel through the scheduler (a running job is stopped on its node); answers the refreshed job view."""
    notice = error = None
    try:
        await c.upstream.post("scheduler", f"/v1/jobs/{job_id}/cancel",
                              {"reason": "cancelled from the console"})
        notice = "Cancelled: a running job is being stopped on its node."
    except UpstreamError as exc:
        error = f"scheduler refused: {exc.detail}"
    c.hub.mark("job")
    view = await job_view(c, job_id)
    if error:
        view["errors"] = [error, *view["errors"]]
    return HTMLResponse(fragment("_job_live.html", notice=notice, **view))


@router.get("/live/jobs/{job_id}")
async def job_live(job_id: str, c: ConsoleDep, _: SessionDep) -> Response:
    async def render() -> Frames:
        return [("job", fragment("_job_live.html", **await job_view(c, job_id)))]

    # Telemetry ticks every second: while a job runs, its log tail follows at that pace.
    return sse(c.hub.stream(f"job:{job_id}", {"job", "gpu"}, render))
