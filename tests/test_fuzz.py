"""Every route of every service, fuzzed from its own /openapi.json through the real app on real NATS and Redis:
malformed input is answered 4xx (or handled), never 5xx, and no request crashes the service.

A few examples per route here (seeded: a failure names its seed); bench/fuzz.py sends thousands.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from .fuzzing import TOKEN, UPLOADS, Tally, outcome_of, printable, requests_for
from .processes import until

SERVICES = ("alerting", "billing", "inventory", "scheduler", "telemetry")
PER_ROUTE = 20
SEED = 18


def build_service(name: str) -> tuple[Any, Any]:
    """The service's app and its object, built the way its `main` does, with the fuzz admin token."""
    module = importlib.import_module(f"whaleflux.{name}.app")
    settings_type = next(v for k, v in vars(module).items() if k.endswith("Settings") and isinstance(v, type))
    return module.build(settings_type(admin_token=TOKEN))


@asynccontextmanager
async def running(name: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """One service started on the test's servers: a client talking to its app in-process, and its runtime."""
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
    rng = random.Random(f"{seed}-{name}")
    for route, req in requests_for(spec, rng, per_route, UPLOADS.get(name)):
        r = await client.request(req.method, req.url, headers=req.headers, content=req.body)
        outcome = outcome_of(r.status_code)
        tally.count(f"{name} {route}", outcome)
        if outcome == "5xx":
            tally.failures.append(f"{name} {req.method} {printable(req.url)} body={printable(repr(req.body))}"
                                  f" -> {r.status_code} {printable(r.text)}")
    health = await client.get("/healthz")
    assert health.status_code == 200, f"{name} stopped answering after the fuzz run"


async def test_every_route_of_every_service_answers_malformed_input_without_a_5xx(env):
    tally = Tally()
    for name in SERVICES:
        async with running(name) as (client, _):
            await fuzz_service(name, client, PER_ROUTE, SEED, tally)
    routes = len(tally.by_route)
    assert routes >= 60, f"only {routes} routes fuzzed"
    assert tally.total("4xx") >= routes, tally.by_route  # the input was bad, and the services said so
    assert not tally.failures, f"seed {SEED}: {len(tally.failures)} 5xx:\n" + "\n".join(tally.failures[:30])
