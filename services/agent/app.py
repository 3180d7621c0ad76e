"""The node agent process: one or more nodes on one NATS connection, plus a small HTTP server.

With `--simulate FLEET` it runs simulated nodes of a fleet file; with `--nvml`
it runs this machine as one node with its real GPUs. The HTTP server (port
`WHALEFLUX_HTTP_PORT`, default 8710) answers `/healthz`, lists the nodes at
`/v1/nodes`, and takes fault injections for simulated nodes at
`POST /admin/faults` (an operator's bearer token, or WHALEFLUX_ADMIN_TOKEN: docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import structlog
import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from pydantic import Field, ValidationInfo, field_validator, model_validator
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

from whaleflux.shared import job_paths
from whaleflux.shared.access_http import install_access, require_role
from whaleflux.shared.apidocs import mount_api_docs
from whaleflux.shared.bus import Bus
from whaleflux.shared.catalog import FleetNode, gpu_models, load_fleet
from whaleflux.shared.clock import system_clock
from whaleflux.shared.datafiles import DEFAULT_FLEET
from whaleflux.shared.events import GpuIdentity
from whaleflux.shared.localconfig import home
from whaleflux.shared.logs import configure_logging
from whaleflux.shared.runtime_http import guard_input
from whaleflux.shared.settings import CommonSettings

from . import jobarea, jobuser, runner
from .burnin.gate import NodeGate, Policy, record_path
from .burnin.plan import CHECKS, BurnInPlan, Intensity, PlanError, make_plan, parse_checks, parse_duration
from .burnin.run import Exerciser
from .faults import FAULT_HELP, ClearFaults, Fault
from .node import NodeAgent
from .simulated import SimulatedNode

# A root agent's jobs' areas when its home lies where they cannot pass (as /root does).
DEFAULT_ROOT_AREAS = "/var/lib/whaleflux/areas"

log = structlog.get_logger("whaleflux.agent")

# Nodes of one agent process started at once (their consumers created, registrations sent).
START_AT_ONCE = 32


class AgentSettings(CommonSettings):
    required_secrets = ("admin_token", "nats_password")  # the agent never talks to Redis
    http_port: int = Field(8710, ge=0, le=65535)
    interval_s: float = Field(1.0, ge=0.1, le=60)
    # A planned stop gives each job this long between SIGTERM and SIGKILL (so do self-fencing supervisors).
    stop_grace_s: float = Field(5.0, ge=0, le=300)
    # The self-fence budget (docs/services/agent.md): a job's supervisor stops it once the agent has got no
    # heartbeat out for this long, so a NATS stall shorter than this kills nothing. The scheduler reads the same
    # variable and holds a lost node's jobs at least this long (plus the grace) before it runs them elsewhere.
    fence_after_s: float = Field(60.0, gt=0)
    # No attempt starts unless the attempt store and the log directory each have this much free (disk.py).
    min_free_mib: float = Field(16.0, ge=0)
    seed: int = 0
    # Bench/test mode of simulated nodes (virtual.py): a placed job starts no process and "runs" for the
    # duration its command states (`sleep N`), reporting and obeying stop orders like a real one.
    virtual_jobs: bool = False
    # --nvml: how this machine appears in the fleet.
    node_name: str | None = None
    cluster: str = "onprem"
    rack: str | None = None
    pool: str = "default"
    # The validation gate (burnin/gate.py): burn a node in before it registers: off, first (a new node, new
    # GPUs, a GPU that failed or faulted), always; and the burn-in it runs (as `whaleflux test-gpu`'s options).
    validation: Policy = "off"
    validation_duration: str = "10m"
    validation_intensity: Intensity = "normal"
    validation_checks: str = ",".join(CHECKS)
    # Who jobs run as (jobuser.py): a root agent switches to the user of the job's team/project or team, else to
    # job_user, else to a uid of the team's own (job_uids); root only when allowed. A non-root agent runs them as
    # itself. `whaleflux up` sets job_user to its own user unless one is set (whaleflux/local.py job_defaults).
    job_user: str | None = None
    job_users: dict[str, str] = Field(default_factory=dict, description='{"team" or "team/project": user}')
    allow_root_jobs: bool = False
    # A root agent gives each other team a uid of its own from this range (jobuser.UidPool).
    job_uids: str = jobuser.DEFAULT_UIDS
    # Where jobs' areas are (jobarea.py): default <home>/areas, or /var/lib/whaleflux/areas for a root agent
    # whose home its job users cannot pass through.
    job_areas: Path | None = None
    # Absolute folders a team's jobs may name besides their area, as the scheduler's (shared/job_paths.py).
    team_roots: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("validation_duration", "validation_checks")
    @classmethod
    def _burn_in_option(cls, value: str, info: ValidationInfo) -> str:
        parse = parse_duration if info.field_name == "validation_duration" else parse_checks
        try:
            parse(value)
        except PlanError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None  # pydantic names the setting
        return value

    @property
    def burn_in(self) -> BurnInPlan:
        """The gate's burn-in: all GPUs, the settings' duration, intensity and checks."""
        return make_plan(duration=self.validation_duration, intensity=self.validation_intensity,
                         checks=self.validation_checks)

    def users(self) -> jobuser.JobUsers:
        return jobuser.JobUsers.resolve(self.job_user, self.job_users, self.allow_root_jobs,
                                        pool_file=str(home() / "job-uids.json"), uids=self.job_uids)

    def places(self, users: jobuser.JobUsers) -> runner.JobPlaces:
        """Where jobs keep their folders; SystemExit naming WHALEFLUX_JOB_AREAS when job users could not reach it."""
        areas = self.job_areas or home() / "areas"
        if self.job_areas is None and users.switches and jobarea.unreachable(str(areas)) is not None:
            areas = Path(DEFAULT_ROOT_AREAS)
        blocked = jobarea.unreachable(str(areas)) if users.switches else None
        if blocked is not None:
            raise SystemExit(f"WHALEFLUX_JOB_AREAS: jobs' users cannot reach {areas}: {blocked} lets only its owner"
                             " through (chmod o+x it, or name a folder they can reach)")
        return runner.JobPlaces(areas.absolute(), self.team_roots)

    @model_validator(mode="after")
    def _fence_outlasts_heartbeats(self) -> AgentSettings:
        # Supervisors judge the agent by its heartbeats: a gap shorter than two of them would stop healthy jobs.
        if self.fence_after_s <= 2 * self.interval_s:
            raise ValueError("WHALEFLUX_FENCE_AFTER_S must be more than twice WHALEFLUX_INTERVAL_S")
        self.users()  # a user that cannot be used stops the start
        job_paths.check_roots(self.team_roots)
        return self


def select_nodes(fleet_path: Path, node_names: list[str] | None) -> list[FleetNode]:
    """The named nodes of a fleet file (all of them when none are named)."""
    nodes = load_fleet(fleet_path).nodes()
    if node_names:
        unknown = sorted(set(node_names) - {n.name for n in nodes})
        if unknown:
            have = ", ".join(n.name for n in nodes)
            raise SystemExit(f"{fleet_path}: no node(s) named {', '.join(unknown)}; fleet has {have}")
        nodes = [n for n in nodes if n.name in node_names]
    return nodes


def _job_settings(settings: AgentSettings) -> dict:
    """Where jobs keep their logs and attempt folders, and how they are stopped."""
    users = settings.users()
    return dict(interval_s=settings.interval_s, log_dir=home() / "jobs", attempts_dir=home() / "attempts",
                stop_grace_s=settings.stop_grace_s, fence_after_s=settings.fence_after_s,
                job_users=users, places=settings.places(users),
                min_free_bytes=int(settings.min_free_mib * 1024 * 1024))


ExerciserFactory = Callable[[list[GpuIdentity]], Exerciser]


def _gate(settings: AgentSettings, node: FleetNode, exerciser: ExerciserFactory) -> NodeGate | None:
    if settings.validation == "off":
        return None
    return NodeGate(node.cluster, node.name, settings.validation, settings.burn_in,
                    record_path(home(), node.cluster, node.name), exerciser)


def simulated_agents(bus: Bus, nodes: list[FleetNode], settings: AgentSettings) -> list[NodeAgent]:
    from .burnin.simulated import SimulatedExerciser

    models = gpu_models()
    agents = []
    for node in nodes:
        backend = SimulatedNode(node.name, models[node.gpu_model], node.gpus, seed=settings.seed, rack=node.rack,
                                interconnect=node.interconnect)

        def exerciser(_gpus: list[GpuIdentity], b: SimulatedNode = backend) -> Exerciser:
            return SimulatedExerciser(b, system_clock())

        gate = _gate(settings, node, exerciser)
        agents.append(NodeAgent(bus, node, backend, **_job_settings(settings), virtual_jobs=settings.virtual_jobs,
                                gate=gate))
    return agents


def nvml_agent(bus: Bus, settings: AgentSettings) -> NodeAgent:
    """This machine as one node, sampled through NVML."""
    from whaleflux.shared.subjects import token

    from .nvml import NvmlBackend

    backend = NvmlBackend()
    ids = backend.identities()
    if not ids:
        raise SystemExit("--nvml: NVML found no GPU on this machine")
    name = token(settings.node_name or socket.gethostname().split(".")[0])
    node = FleetNode(
        name=name, group="nvml", cluster=settings.cluster, rack=settings.rack or name, pool=settings.pool,
        ownership="owned", gpu_model=ids[0].model, gpus=len(ids), interconnect="pcie",
    )
    def exerciser(gpus: list[GpuIdentity]) -> Exerciser:
        from .burnin.cuda import CudaExerciser

        nvlink = any((s.nvlink_links_active or 0) > 0 for s in backend.sample(system_clock()))
        return CudaExerciser(gpus, settings.burn_in.intensity, peer_link="nvlink" if nvlink else "pcie")

    return NodeAgent(bus, node, backend, **_job_settings(settings), gate=_gate(settings, node, exerciser))


def create_app(agents: list[NodeAgent], settings: AgentSettings) -> FastAPI:
    """The agent's HTTP API: health, its nodes, fault injection (admin)."""
    # /docs and /redoc from vendored assets, like the services: FastAPI's defaults need a CDN.
    app = FastAPI(title="WhaleFlux agent", docs_url=None, redoc_url=None)
    mount_api_docs(app)
    guard_input(app)  # body limit, NaN/Infinity refused, 422s that render any bytes (no 500)
    install_access(app, "agent", settings)  # tokens and roles as the services have them; faults are audited
    by_name = {a.node.name: a for a in agents}
    viewer, operator = Depends(require_role("viewer")), Depends(require_role("operator"))

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict:
        """Alive: the process answers, and every node's placement consumer loop runs (503 naming any that ended:
        its node would take no more jobs, so a supervisor or a liveness probe restarts the agent)."""
        ended = sorted({name for a in agents for name in a.bus.ended_consumers()})
        if ended:
            raise HTTPException(503, f"consumer loop ended: {', '.join(ended)}")
        return {"status": "ok", "service": "agent", "nodes": len(agents)}

    @app.get("/v1/nodes", tags=["agent"], dependencies=[viewer])
    async def nodes() -> list[dict]:
        """The nodes this agent runs, their GPUs and running jobs."""
        return [
            {
                "cluster": a.node.cluster, "node": a.node.name, "model": a.node.gpu_model,
                "gpus": [g.model_dump() for g in a.backend.identities()],
                "simulated": isinstance(a.backend, SimulatedNode),
                "silent": a.silent_until is not None,
                "jobs": sorted({k[0] for k in a.jobs}),
                "validation": a.gate.status(system_clock()) if a.gate is not None else None,
            }
            for a in agents
        ]

    @app.get("/v1/faults", tags=["agent"], dependencies=[viewer])
    async def fault_kinds() -> dict[str, str]:
        """The faults that can be injected, and what each does."""
        return FAULT_HELP

    @app.post("/admin/faults", tags=["admin"], dependencies=[operator])
    async def inject(fault: Fault) -> dict:
        """Inject a fault into a simulated node (or one of its GPUs)."""
        agent = by_name.get(fault.node)
        if agent is None:
            runs = ", ".join(sorted(by_name))
            raise HTTPException(404, f"node: this agent runs no node {fault.node!r} (it runs {runs})")
        if fault.kind == "node-silent":
            agent.go_silent(fault.duration_s)
            done = f"node-silent on {fault.node}" + (f" for {fault.duration_s:g}s" if fault.duration_s else "")
        elif not isinstance(agent.backend, SimulatedNode):
            raise HTTPException(409, f"node: {fault.node} has real GPUs; faults are injected only into simulated ones")
        else:
            try:
                done = agent.backend.inject(fault)
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
        log.warning("agent.fault_injected", kind=fault.kind, node=fault.node, gpu=fault.gpu)
        return {"injected": done}

    @app.post("/admin/faults/clear", tags=["admin"], dependencies=[operator])
    async def clear(body: ClearFaults) -> dict:
        """Undo the faults injected into one simulated node (or, with no node, into every node this agent runs):
        a silent node speaks again, each faulted GPU is as built. `cleared` names what was undone per node."""
        if body.node is not None and body.node not in by_name:
            runs = ", ".join(sorted(by_name))
            raise HTTPException(404, f"node: this agent runs no node {body.node!r} (it runs {runs})")
        targets = [by_name[body.node]] if body.node is not None else agents
        cleared: dict[str, list[str]] = {}
        for agent in targets:
            undone = ["node-silent"] if agent.speak_again() else []
            if isinstance(agent.backend, SimulatedNode):
                undone += [f"GPU {i}" for i in agent.backend.clear()]
            cleared[agent.node.name] = undone
            if undone:
                log.warning("agent.faults_cleared", node=agent.node.name, cleared=undone)
        return {"cleared": cleared}

    return app


def http_server(app: FastAPI, settings: AgentSettings) -> uvicorn.Server:
    config = uvicorn.Config(app, host=settings.http_host, port=settings.http_port, log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    # The agent's signal handlers stop it; uvicorn must not capture SIGINT/SIGTERM itself.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    return server


async def serve_http(server: uvicorn.Server, port: int) -> None:
    """Serve until `server.should_exit`; a failure to bind is logged, not fatal."""
    try:
        await server.serve()
    except (SystemExit, OSError) as exc:
        # A busy port must not stop telemetry or jobs: run on without the HTTP API.
        log.error("agent.http_failed", port=port, error=repr(exc))


def _waiting(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("agent.waiting_for_nats", error=repr(error), retry_in_s=state.upcoming_sleep)


async def _connect(settings: AgentSettings) -> Bus:
    """Connect to NATS and declare the streams, waiting (with back-off up to 5 s) for as long as it takes."""
    backoff = wait_exponential(multiplier=0.2, max=5)
    async for attempt in AsyncRetrying(wait=backoff, before_sleep=_waiting, reraise=True):
        with attempt:
            bus = await Bus.connect(settings.nats_url, source=f"whaleflux/agent/{settings.instance}",
                                    user=settings.nats_user, password=settings.secret("nats_password"),
                                    replicas=settings.nats_replicas)
            try:
                await bus.ensure_streams()
            except BaseException:
                await bus.close()
                raise
            return bus
    raise AssertionError("unreachable: tenacity retries until connected")


async def run_agent(settings: AgentSettings, fleet_path: Path = DEFAULT_FLEET, node_names: list[str] | None = None,
                    nvml: bool = False) -> None:
    """Run the nodes (simulated from the fleet file, or this machine's GPUs) until signalled."""
    nodes = [] if nvml else select_nodes(fleet_path, node_names)
    bus = await _connect(settings)
    agents = [nvml_agent(bus, settings)] if nvml else simulated_agents(bus, nodes, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Nodes start a few dozen at a time: one by one, the placement consumers of 1,000 simulated nodes
    # took over a minute to create.
    for i in range(0, len(agents), START_AT_ONCE):
        await asyncio.gather(*(a.start() for a in agents[i : i + START_AT_ONCE]))
    server = http_server(create_app(agents, settings), settings)
    http = asyncio.create_task(serve_http(server, settings.http_port), name="agent-http")
    await stop.wait()
    log.info("agent.stopping")
    server.should_exit = True
    await asyncio.wait({http}, timeout=5)  # serve_http logs its own failures
    await asyncio.gather(*(a.stop() for a in agents))
    await bus.close()
    for agent in agents:
        close = getattr(agent.backend, "close", None)
        if close is not None:
            close()


async def run_simulated(settings: AgentSettings, fleet_path: Path = DEFAULT_FLEET,
                        node_names: list[str] | None = None) -> None:
    """Simulate the named nodes of a fleet file (all of them when none are named) until signalled."""
    await run_agent(settings, fleet_path, node_names)


def main(fleet: Path = DEFAULT_FLEET, nodes: list[str] | None = None, nvml: bool = False) -> None:
    settings = AgentSettings()
    configure_logging("agent", settings.log_level)
    asyncio.run(run_agent(settings, fleet, nodes, nvml))
