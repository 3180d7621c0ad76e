"""Inventory and the agent's burn-ins: a GPU whose last gpu.validated failed is a `quarantined` finding with its
age and reasons, until a later burn-in passes (issue 22)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from whaleflux.agent.burnin.plan import make_plan
from whaleflux.agent.burnin.run import run_burnin
from whaleflux.agent.burnin.simulated import SimulatedExerciser
from whaleflux.agent.faults import Fault
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.inventory.app import InventorySettings, build
from whaleflux.inventory.findings import Validation, quarantined
from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuValidated, NodeRegistered

from .processes import Clock, connect_bus, until

T0 = datetime(2026, 12, 1, 8, tzinfo=UTC)


def test_a_failed_burn_in_is_a_finding_with_its_age_and_a_passed_one_is_not():
    failed = Validation("GPU-b", "onprem", "h100-02", 3, "fail", T0, ("thermal: throttled at 90 °C", "compute: slow"))
    found = quarantined([Validation("GPU-a", "onprem", "h100-01", 0, "pass", T0), failed], T0 + timedelta(hours=5))
    assert [(f.kind, f.severity, f.gpus) for f in found] == [("quarantined", "warning", ("GPU-b",))]
    assert found[0].summary == "GPU 3 of h100-02 failed its burn-in 5.0 h ago: thermal: throttled at 90 °C"
    assert found[0].detail["age_h"] == "5.0" and found[0].detail["validated_at"] == T0.isoformat()


def _validated(node: SimulatedNode, at: datetime) -> GpuValidated:
    report = run_burnin(node, SimulatedExerciser(node, at), make_plan(duration="1m"))
    return report.validated("onprem", node.node, "first registration: no burn-in on record")


async def test_inventory_finds_the_quarantined_gpu_and_forgets_it_once_it_passes(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_CHECK_INTERVAL_S", "3600")
    clock = Clock(T0 + timedelta(hours=2))
    bus = await connect_bus(env)
    app, inv = build(InventorySettings(), clock=clock)
    await inv.runtime.start()
    try:
        broken = SimulatedNode("h100-09", gpu_models()["H100"], 2)
        broken.inject(Fault(kind="cooling", node="h100-09", gpu=1))
        registered = NodeRegistered(cluster="onprem", node="h100-09", agent_version="test", gpus=broken.identities())
        await bus.publish(subjects.node_registered("onprem", "h100-09"), registered)
        await bus.publish(subjects.gpu_validated("onprem", "h100-09"), _validated(broken, T0))

        async def quarantine():
            return [f for f in await inv.all_findings(clock()) if f.kind == "quarantined"]
        [found] = await until(quarantine, what="the quarantined GPU found")
        assert found.gpus == (broken.identities()[1].uuid,)
        assert found.summary.startswith("GPU 1 of h100-09 failed its burn-in 2.0 h ago: ")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inventory") as http:
            [row] = await until(lambda: _rows(http), what="the node in /v1/inventory")
        assert (row["key"], row["gpus"], row["validated"], row["quarantined"]) == ("H100", 2, 1, 1)

        repaired = SimulatedNode("h100-09", gpu_models()["H100"], 2)
        await bus.publish(subjects.gpu_validated("onprem", "h100-09"), _validated(repaired, T0 + timedelta(hours=1)))
        await until(lambda: _none_left(inv, clock), what="the finding gone after a passing burn-in")
    finally:
        await inv.runtime.stop()
        await bus.close()


async def _rows(http: httpx.AsyncClient) -> list[dict]:
    return (await http.get("/v1/inventory", params={"by": "model"})).json()


async def _none_left(inv, clock) -> bool:
    return not [f for f in await inv.all_findings(clock()) if f.kind == "quarantined"]
