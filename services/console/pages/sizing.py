"""Sizing: `whaleflux size` as a form (the scheduler's POST /v1/size), and the small estimate beside the submit form."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from whaleflux.shared.sizing.architectures import catalogue_names

from ..models import SizingReport
from ..upstream import UpstreamError
from ..web import ConsoleDep, CsrfDep, SessionDep, fragment, page

router = APIRouter()
TASKS = ["serve", "full", "lora", "qlora"]


def _request(model: str, task: str, context: int, batch: int, tokens: str, max_gpus: int) -> dict:
    body = {"model": model, "task": task, "context": context, "batch": batch, "max_gpus": max_gpus}
    if tokens.strip():
        body["dataset_tokens"] = int(float(tokens))
    return body


@router.get("/sizing", response_class=HTMLResponse)
async def sizing(request: Request, c: ConsoleDep, _: SessionDep, model: str = "", task: str = "serve",
                 context: int = 4096, batch: int = 1, tokens: str = "", max_gpus: int = 8) -> Response:
    asked = {"model": model, "task": task, "context": context, "batch": batch, "tokens": tokens, "max_gpus": max_gpus}
    report, error = None, None
    if model:
        try:
            report = SizingReport.model_validate(
                await c.upstream.post("scheduler", "/v1/size", _request(model, task, context, batch, tokens, max_gpus)))
        except UpstreamError as exc:
            error = exc.detail
        except ValueError:
            error = "tokens: a number, e.g. 100000000"
    return page(request, "sizing.html", "sizing", asked=asked, report=report, error=error, models=catalogue_names(),
                tasks=TASKS)


@router.post("/sizing/estimate", response_class=HTMLResponse)
async def estimate(c: ConsoleDep, _: CsrfDep, size_model: Annotated[str, Form()] = "",
                   size_task: Annotated[str, Form()] = "serve", size_context: Annotated[int, Form()] = 4096,
                   gpus: Annotated[int, Form()] = 1) -> Response:
    """The submit form's estimate: what the model needs, on which GPUs, for the job's GPU count."""
    if not size_model:
        return HTMLResponse(fragment("_estimate.html", report=None, error=None))
    try:
        report = SizingReport.model_validate(await c.upstream.post(
            "scheduler", "/v1/size", _request(size_model, size_task, size_context, 1, "", max(gpus, 1))))
        error = None
    except UpstreamError as exc:
        report, error = None, exc.detail
    return HTMLResponse(fragment("_estimate.html", report=report, error=error))
