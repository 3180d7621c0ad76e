"""Telemetry's HTTP API: latest samples, node and fleet summaries, history, job usage, DCGM `/metrics` families."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from whaleflux.shared.deps import NowDep, ViewerDep
from whaleflux.shared.runtime import BadRequest

from . import dcgm, views
from .history import Point, Rollup, resolution_for
from .runs import NoRun, Runs
from .settings import TelemetrySettings
from .store import TelemetryStore
from .usage import JobUsage
from .views import GpuStatus, NodeSummary


class TelemetryParts(Protocol):
    """What the routes use, kept on `app.state.telemetry`."""

    @property
    def store(self) -> TelemetryStore: ...
    @property
    def runs(self) -> Runs: ...
    settings: TelemetrySettings


def _parts(request: Request) -> TelemetryParts:
    parts: TelemetryParts = request.app.state.telemetry
    return parts


def _store(request: Request) -> TelemetryStore:
    return _parts(request).store


def _runs(request: Request) -> Runs:
    return _parts(request).runs


def _settings(request: Request) -> TelemetrySettings:
    return _parts(request).settings


StoreDep = Annotated[TelemetryStore, Depends(_store)]
RunsDep = Annotated[Runs, Depends(_runs)]
SettingsDep = Annotated[TelemetrySettings, Depends(_settings)]

router = APIRouter(tags=["telemetry"], dependencies=[ViewerDep])


async def gpu_statuses(store: TelemetryStore, runs: Runs, now: datetime, stale_after_s: float,
                       node: str | None = None) -> list[GpuStatus]:
    """Every GPU's latest sample with age, flags, last XID and job, sorted by node and index."""
    xids = await store.last_xids()
    jobs = await runs.jobs_by_gpu()
    return [views.status(s, xids.get(s.gpu.uuid), jobs.get(s.gpu.uuid), now, stale_after_s)
            for s in await store.latest(node)]


async def dcgm_text(store: TelemetryStore, runs: Runs, now: datetime, stale_after_s: float) -> bytes:
    """Every fresh GPU's DCGM families (a GPU that stopped reporting must not look alive)."""
    identities = await store.identities()
    states = []
    for st in await gpu_statuses(store, runs, now, stale_after_s):
        if st.stale:
            continue  # dcgm-exporter's series vanish too
        job = dcgm.JobLabels(st.job.job_id, st.job.team or "", st.job.project or "") if st.job else None
        states.append(dcgm.GpuState(st.cluster, st.node, st.gpu, identities.get(st.gpu.uuid), job, st.last_xid or 0))
    return dcgm.render(states).encode()


@router.get("/v1/fleet")
async def fleet(store: StoreDep, runs: RunsDep, settings: SettingsDep, now: NowDep) -> dict[str, Any]:
    """Fleet totals: GPUs and nodes reporting, by model, and how many are stale, hot, throttled or erroring."""
    return views.fleet(await gpu_statuses(store, runs, now, settings.stale_after_s))


@router.get("/v1/nodes")
async def nodes(store: StoreDep, runs: RunsDep, settings: SettingsDep, now: NowDep) -> list[NodeSummary]:
    """One row per node: GPUs reporting, mean utilization, power, memory, last sample."""
    return views.node_summaries(await gpu_statuses(store, runs, now, settings.stale_after_s))


@router.get("/v1/nodes/{node}")
async def node(node: str, store: StoreDep, runs: RunsDep, settings: SettingsDep, now: NowDep) -> dict[str, Any]:
    """One node's summary and its GPUs."""
    gs = await gpu_statuses(store, runs, now, settings.stale_after_s, node)
    if not gs:
        raise HTTPException(404, f"node: no samples from a node named {node!r}")
    return {"summary": views.node_summary(gs[0].cluster, node, gs), "gpus": gs}


@router.get("/v1/gpus")
async def gpus(store: StoreDep, runs: RunsDep, settings: SettingsDep, now: NowDep,
               node: str | None = None) -> list[GpuStatus]:
    """Latest sample of every GPU (optionally of one node), with flags and the job holding it."""
    return await gpu_statuses(store, runs, now, settings.stale_after_s, node)


@router.get("/v1/gpus/{uuid}")
async def gpu(uuid: str, store: StoreDep, runs: RunsDep, settings: SettingsDep, now: NowDep) -> GpuStatus:
    """Latest sample of one GPU."""
    sample = await store.latest_of(uuid)
    if sample is None:
        raise HTTPException(404, f"uuid: no sample for GPU {uuid!r}")
    return views.status(sample, await store.last_xid(uuid), await runs.job_of(uuid), now, settings.stale_after_s)


@router.get("/v1/gpus/{uuid}/history")
async def history(
    uuid: str,
    store: StoreDep,
    settings: SettingsDep,
    now: NowDep,
    since: datetime | None = Query(None, description="default: 10 minutes ago"),
    until: datetime | None = Query(None, description="default: now"),
    resolution: str = Query("auto", pattern="^(auto|raw|1m)$"),
) -> dict[str, Any]:
    """Raw points (1 s) within the raw retention, minute rollups beyond it."""
    since_t = (since or now - timedelta(minutes=10)).timestamp()
    until_t = (until or now).timestamp()
    if since_t >= until_t:
        raise BadRequest("since: must be before until")
    if not await store.knows_gpu(uuid):
        raise HTTPException(404, f"uuid: no sample for GPU {uuid!r}")
    res = resolution_for(since_t, now.timestamp(), settings.raw_retention_s) if resolution == "auto" else resolution
    rows: list[Point] | list[Rollup]
    if res == "raw":
        rows = (await store.points([uuid], since_t, until_t))[uuid]
    else:
        rows = (await store.rollups([uuid], since_t, until_t))[uuid]
    return {"uuid": uuid, "resolution": res, "points": [r.as_dict() for r in rows]}


@router.get("/v1/jobs/{job_id}/usage")
async def job_usage(job_id: str, runs: RunsDep) -> JobUsage:
    """Mean/peak utilization and memory and the energy of a job's GPUs over its run."""
    try:
        return await runs.usage(job_id)
    except NoRun as exc:
        raise HTTPException(404, str(exc)) from None
