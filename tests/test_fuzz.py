"""Every route of every service, fuzzed by schemathesis from its own /openapi.json through the real app on real NATS
and Redis: malformed input is answered 4xx (or handled), never 5xx, and no request crashes the service; the upload
endpoints also get hostile YAML.

A few cases per route here (seeded: a failure names its seed); bench/fuzz.py sends thousands.
"""

from __future__ import annotations

import importlib
import random
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from .fuzz_http import requests_for
from .fuzzing import TOKEN, UPLOADS, Tally, hostile_yaml, outcome_of, printable
from .processes import until

SERVICES = ("alerting", "billing", "inventory", "scheduler", "telemetry")
APPS = (*SERVICES, "agent")  # the agent's API too: one simulated node, faults injected into it
PER_ROUTE = 8  # malformed cases per route (and 2 that fit the schema): the whole test in about a minute
SEED = 18


def build_service(name: str) -> tuple[Any, Any]:
    """The service's app and its object, built the way its `main` does, with the fuzz admin token."""
    module = importlib.import_module(f"whaleflux.{name}.app")
    settings_type = next(v for k, v in vars(module).items() if k.endswith("Settings") and isinstance(v, type))
    return module.build(settings_type(admin_token=TOKEN))


@asynccontextmanager
async def agent_running() -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """An agent of one simulated node on the environment's servers, and a client talking to its app in-process."""
    from whaleflux.agent.app import AgentSettings, create_app
    from whaleflux.agent.node import NodeAgent
    from whaleflux.agent.simulated import SimulatedNode
    from whaleflux.shared.bus import Bus
    from whaleflux.shared.catalog import FleetNode, gpu_models

    settings = AgentSettings(admin_token=TOKEN)
    bus = await Bus.connect(settings.nats_url, source="whaleflux/agent/fuzz", user=settings.nats_user,
                            password=settings.secret("nats_password"))
    await bus.ensure_streams()
    node = FleetNode(name="fuzz-01", group="h100", cluster="fuzz", rack="r1", pool="default", ownership="owned",
                     gpu_model="H100", gpus=2, interconnect="nvlink")
    folder = Path(tempfile.mkdtemp(prefix="wf-fuzz-agent-"))
    agent = NodeAgent(bus, node, SimulatedNode(node.name, gpu_models()["H100"], 2, interconnect="nvlink"),
                      interval_s=1.0, log_dir=folder / "jobs", attempts_dir=folder / "attempts")
    await agent.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app([agent], settings),
                                                             raise_app_exceptions=False),
                               base_url="http://agent", timeout=30)
    try:
        yield client, agent
    finally:
        await client.aclose()
        await agent.stop()
        await bus.close()


@asynccontextmanager
async def running(name: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """One service (or the agent) started on the test's servers: a client talking to its app in-process, and its
    runtime (the agent's NodeAgent)."""
    if name == "agent":
        async with agent_running() as started:
            yield started
        return
    app, _ = build_service(name)
    runtime = app.state.runtime
    await runtime.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                               base_url=f"http://{name}", timeout=30)
    try:
        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200
        await until(ready, timeout=60, what=f"{name} ready")
        if name == "scheduler":
            async def leading() -> bool:
                return (await client.get("/v1/leader")).json()["role"] == "leader"
            await until(leading, timeout=60, what="scheduler leading")
        yield client, runtime
    finally:
        await client.aclose()
        await runtime.stop()


async def fuzz_service(name: str, client: httpx.AsyncClient, per_route: int, seed: int, tally: Tally) -> None:
    spec = (await client.get("/openapi.json")).json()
    for route, req in requests_for(spec, per_route, seed, TOKEN):
        await send(name, client, route, req.method, req.url, req.headers, req.body, tally)
    if name in UPLOADS:
        method, path = UPLOADS[name]
        rng = random.Random(f"{seed}-{name}")
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}
        for _ in range(per_route):
            await send(name, client, f"{method} {path} (yaml)", method, path, headers, hostile_yaml(rng), tally)
    health = await client.get("/healthz")
    assert health.status_code == 200, f"{name} stopped answering after the fuzz run"


async def send(name: str, client: httpx.AsyncClient, route: str, method: str, url: str, headers: dict[str, str],
               body: bytes | None, tally: Tally) -> None:
    r = await client.request(method, url, headers=headers, content=body)
    outcome = outcome_of(r.status_code)
    tally.count(f"{name} {route}", outcome)
    if outcome == "5xx":
        tally.failures.append(f"{name} {method} {printable(url)} body={printable(repr(body))}"
                              f" -> {r.status_code} {printable(r.text)}")


async def test_every_route_of_every_service_answers_malformed_input_without_a_5xx(env):
    tally = Tally()
    for name in APPS:
        async with running(name) as (client, _):
            await fuzz_service(name, client, PER_ROUTE, SEED, tally)
    routes = len(tally.by_route)
    assert routes >= 80, f"only {routes} routes fuzzed"
    assert tally.total("4xx") >= routes, tally.by_route  # the input was bad, and the services said so
    assert not tally.failures, f"seed {SEED}: {len(tally.failures)} 5xx:\n" + "\n".join(tally.failures[:30])
