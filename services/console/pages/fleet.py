"""Fleet: every node and GPU live, the heat map, a node's GPUs (and, for operators, drain, undrain and clearing a
simulated node's faults), a GPU's history charts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from markupsafe import escape

from ..charts import WINDOWS_S, series
from ..fleetfold import NodeLine
from ..heatmap import QUARANTINED
from ..live import Frames
from ..models import FleetSummary, GpuHistory, GpuRow, NodeStatus
from ..paging import page_of
from ..upstream import UpstreamError, fetch_all
from ..web import Console, ConsoleDep, CsrfDep, SessionDep, fragment, page, sse

router = APIRouter()
# Above this many GPUs the fleet page lists nodes only (the heat map still shows every GPU).
GPU_TABLE_MAX = 256
# The node table shows this many nodes a page: at 1,000 nodes every live update would otherwise carry 1,000 rows.
NODES_PER_PAGE = 100


@dataclass
class FleetView:
    summary: FleetSummary | None  # None: nothing could be read
    nodes: list[NodeLine]
    statuses: dict[str, NodeStatus]
    gpus: list[GpuRow]  # the GPU table's rows: a node's, or the fleet's up to GPU_TABLE_MAX
    errors: list[str] = field(default_factory=list)
    heat: str = '{"v":0,"nodes":[],"gpus":0}'  # the heat map's layout (heatmap.py)
    cells: str = "0:"  # its cells

    @property
    def gpu_counts(self) -> dict[str, int] | None:
        """Free, quarantined and draining GPUs, as the scheduler counts them (`gpus list`); None: not read."""
        if not self.statuses:
            return None
        nodes = self.statuses.values()
        return {"free": sum(s.free for s in nodes), "quarantined": sum(len(s.quarantined) for s in nodes),
                "draining": sum(s.draining for s in nodes)}

    @property
    def quarantined(self) -> list[NodeStatus]:
        return [s for s in self.statuses.values() if s.status in QUARANTINED]


async def fleet_view(c: Console, node: str | None = None) -> FleetView:
    """GPUs from the console's own fold of the bus (`fleetstate.py`), node states from the scheduler."""
    values, errors = await fetch_all({"statuses": c.fleet.node_statuses(), "unread": c.fleet.ready()})
    unread: list[str] = values["unread"]
    statuses = {s.node: s for s in values["statuses"] or []}
    if node is not None:
        rows = c.fleet.rows(node)
        return FleetView(None, [], statuses, rows, unread + errors)
    numbers = c.fleet.numbers({n: s.status for n, s in statuses.items()})
    gpus = c.fleet.rows() if numbers.summary.gpus <= GPU_TABLE_MAX else []
    summary = numbers.summary if numbers.summary.gpus or not unread else None
    return FleetView(summary, numbers.nodes, statuses, gpus, unread + errors, numbers.heat, numbers.cells)


def fleet_frames(view: FleetView, page: int = 1) -> Frames:
    """The node table, the heat map's layout and its cells (the live hub sends each only when it changed)."""
    nodes = page_of(view.nodes, page, NODES_PER_PAGE)
    return [("fleet", fragment("_fleet_live.html", v=view, nodes=nodes, errors=view.errors)),
            ("heat-layout", view.heat), ("heat", view.cells)]


@router.get("/", include_in_schema=False)
async def home(_: SessionDep) -> Response:
    return RedirectResponse("/fleet", status_code=303)


@router.get("/fleet", response_class=HTMLResponse)
async def fleet(request: Request, c: ConsoleDep, _: SessionDep, nodes: int = 1) -> Response:
    view = await fleet_view(c)
    number = page_of(view.nodes, nodes, NODES_PER_PAGE).number
    frames = dict(fleet_frames(view, number))
    return page(request, "fleet.html", "fleet", live=frames["fleet"], heat=frames["heat-layout"], cells=frames["heat"],
                v=view, nodes_page=number)


@router.get("/live/fleet")
async def fleet_live(c: ConsoleDep, _: SessionDep, nodes: int = 1) -> Response:
    """One live view per page of the node table: every browser on the same page shares its builds."""
    number = max(1, nodes)

    async def render() -> Frames:
        return fleet_frames(await fleet_view(c), number)

    return sse(c.hub.stream("fleet" if number == 1 else f"fleet:{number}", {"gpu", "node", "job"}, render))


@router.get("/fleet/nodes/{node}", response_class=HTMLResponse)
async def node_page(request: Request, node: str, c: ConsoleDep, _: SessionDep) -> Response:
    view = await fleet_view(c, node)
    if not view.gpus and not view.errors:
        raise HTTPException(404, f"no node {node!r} in telemetry")
    return page(request, "node.html", "fleet", node=node, clears_faults=c.settings.agent_url is not None,
                live=fragment("_node_live.html", v=view, node=node, errors=view.errors))


# Who sees and may press the node page's drain, undrain and clear-faults buttons (the services check it again).
NODE_ACTION_ROLES = ("operator", "admin")


def _operator(request: Request) -> None:
    person = getattr(request.state, "person", None)
    if person is None or person.role not in NODE_ACTION_ROLES:
        raise HTTPException(403, "draining, undraining and clearing faults need an operator")


async def _node_action(c: Console, service: str, path: str, body: dict,
                       said: str | Callable[[dict], list[str]]) -> Response:
    """Do one node action upstream; answer the line that says what happened (or what refused it)."""
    try:
        done = await c.upstream.post(service, path, body)
        lines = [said] if isinstance(said, str) else said(done)
        html = "".join(f'<p class="notice" role="status">{escape(line)}</p>' for line in lines)
    except UpstreamError as exc:
        html = f'<p class="error" role="alert">{escape(service)} refused: {escape(exc.detail)}</p>'
    c.hub.mark("node")
    return HTMLResponse(html)


@router.post("/fleet/nodes/{node}/drain", response_class=HTMLResponse)
async def drain_node(request: Request, node: str, c: ConsoleDep, _: CsrfDep,
                     reason: Annotated[str, Form()] = "") -> Response:
    """Drain the node through the scheduler: nothing new goes there, its jobs are requeued."""
    _operator(request)
    why = reason.strip() or "drained from the console"
    return await _node_action(c, "scheduler", f"/v1/nodes/{node}/drain", {"reason": why},
                              f"{node} draining ({why}): its jobs are stopped and requeued")


@router.post("/fleet/nodes/{node}/undrain", response_class=HTMLResponse)
async def undrain_node(request: Request, node: str, c: ConsoleDep, _: CsrfDep,
                       force: Annotated[bool, Form()] = False) -> Response:
    """Undrain the node; its GPUs whose critical alert still fires stay cordoned unless forced (and are named)."""
    _operator(request)
    return await _node_action(c, "scheduler", f"/v1/nodes/{node}/undrain", {"force": force},
                              lambda done: [done["said"]])


@router.post("/fleet/nodes/{node}/clear-faults", response_class=HTMLResponse)
async def clear_faults(request: Request, node: str, c: ConsoleDep, _: CsrfDep) -> Response:
    """Clear the faults injected into a simulated node (the agent's admin endpoint)."""
    _operator(request)
    if c.settings.agent_url is None:
        raise HTTPException(404, "this console knows no agent (WHALEFLUX_AGENT_URL): use `whaleflux sim clear`")

    def said(done: dict) -> list[str]:
        undone = done["cleared"].get(node, [])
        return [f"{node}: " + (f"cleared {', '.join(undone)}" if undone else "no injected faults")]

    return await _node_action(c, "agent", "/admin/faults/clear", {"node": node}, said)


@router.get("/live/nodes/{node}")
async def node_live(node: str, c: ConsoleDep, _: SessionDep) -> Response:
    async def render() -> Frames:
        view = await fleet_view(c, node)
        return [("node", fragment("_node_live.html", v=view, node=node, errors=view.errors))]

    return sse(c.hub.stream(f"node:{node}", {"gpu", "node", "job"}, render))


@router.get("/fleet/gpus/{uuid}", response_class=HTMLResponse)
async def gpu_page(request: Request, uuid: str, c: ConsoleDep, _: SessionDep, window: str = "15m") -> Response:
    if window not in WINDOWS_S:
        window = "15m"
    row = await c.upstream.get_as(GpuRow, "telemetry", f"/v1/gpus/{uuid}")
    return page(request, "gpu.html", "fleet", row=row, window=window, windows=list(WINDOWS_S),
                live=fragment("_gpu_live.html", row=row))


@router.get("/fleet/gpus/{uuid}/history.json")
async def gpu_history(uuid: str, c: ConsoleDep, _: SessionDep, window: str = "15m") -> JSONResponse:
    """The chart's columns; the browser asks once per page load, then appends the live points."""
    now = datetime.now(UTC).timestamp()
    hist = await c.upstream.get_as(GpuHistory, "telemetry", f"/v1/gpus/{uuid}/history",
                                   since=now - WINDOWS_S.get(window, 900), until=now)
    return JSONResponse({"resolution": hist.resolution, **series(hist.points, hist.resolution)})


@router.get("/live/gpus/{uuid}")
async def gpu_live(uuid: str, c: ConsoleDep, _: SessionDep) -> Response:
    async def render() -> Frames:
        row = await c.upstream.get_as(GpuRow, "telemetry", f"/v1/gpus/{uuid}")
        point = {"t": row.sample_time.timestamp(), "util": row.gpu.utilization_gpu_pct, "temp": row.gpu.temperature_c,
                 "power": row.gpu.power_w, "mem_gib": round(row.gpu.memory_used_mib / 1024, 2)}
        return [("gpu", fragment("_gpu_live.html", row=row)), ("point", json.dumps(point))]

    return sse(c.hub.stream(f"gpu:{uuid}", {"gpu"}, render))

