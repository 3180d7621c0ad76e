"""The validation gate: a node is burnt in before it registers (WHALEFLUX_VALIDATION), registers only the GPUs
that passed, and is burnt in again after a GPU fault or while a GPU stays failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from whaleflux.agent.app import AgentSettings, create_app
from whaleflux.agent.burnin.gate import NodeGate, ValidationRecord, fault_seen, load, needs_validation, save, usable
from whaleflux.agent.burnin.plan import make_plan
from whaleflux.agent.burnin.run import run_burnin
from whaleflux.agent.burnin.simulated import SimulatedExerciser
from whaleflux.agent.faults import Fault
from whaleflux.agent.node import NodeAgent
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared import subjects
from whaleflux.shared.catalog import FleetNode, gpu_models
from whaleflux.shared.events import GpuSample, GpuValidated, NodeRegistered, decode

from .processes import connect_bus, until

T0 = datetime(2026, 12, 1, tzinfo=UTC)
CLUSTER, NODE = "onprem", "h100-07"


def sim(gpus: int = 4, *faults: str) -> SimulatedNode:
    node = SimulatedNode(NODE, gpu_models()["H100"], gpus, interconnect="nvlink")
    for kind in faults:
        name, _, gpu = kind.partition(":")
        node.inject(Fault(kind=name, node=NODE, gpu=int(gpu)))  # type: ignore[arg-type]
    return node


def record_of(node: SimulatedNode, **extra) -> ValidationRecord:
    report = run_burnin(node, SimulatedExerciser(node, T0), make_plan(duration="1m"))
    return ValidationRecord(cluster=CLUSTER, node=NODE, report=report, **extra)


# ------------------------------------------------------------------------------------------ the decisions


def test_when_a_node_must_be_burnt_in():
    healthy = sim()
    gpus = healthy.identities()
    passed = record_of(healthy)
    assert needs_validation("off", None, gpus, 0) is None
    assert needs_validation("first", None, gpus, 0) == "first registration: no burn-in on record"
    assert needs_validation("first", passed, gpus, 0) is None
    assert needs_validation("always", passed, gpus, 0) == "every start (WHALEFLUX_VALIDATION=always)"
    assert needs_validation("always", None, gpus, running_attempts=2) is None  # never under running jobs
    faulted = passed.model_copy(update={"fault": "XID 79 on GPU 2", "fault_at": T0})
    assert needs_validation("first", faulted, gpus, 0) == "a GPU fault since the last burn-in: XID 79 on GPU 2"
    bigger = SimulatedNode("other", gpu_models()["H100"], 1).identities()[0].model_copy(update={"index": 4})
    assert needs_validation("first", passed, [*gpus, bigger], 0) == "GPU(s) 4 not burnt in yet"
    failed = record_of(sim(4, "cooling:1"))
    assert needs_validation("first", failed, gpus, 0) == "GPU(s) 1 failed the last burn-in"


def test_a_failed_gpu_is_quarantined_and_a_warned_one_kept():
    node = sim(4, "cooling:1", "vram-flip:2")
    record = record_of(node)
    assert [c.verdict for c in record.report.gpus] == ["pass", "fail", "warn", "pass"]
    assert [g.index for g in usable(node.identities(), record, "first")] == [0, 2, 3]
    assert len(usable(node.identities(), record, "off")) == 4


def _sample(index: int, **over) -> GpuSample:
    return GpuSample(**({"uuid": f"GPU-{index}", "index": index, "model": "H100", "utilization_gpu_pct": 0.0,
                         "memory_used_mib": 0.0, "memory_total_mib": 81559.0, "temperature_c": 40.0} | over))


def test_faults_that_call_for_another_burn_in():
    before = {"GPU-0": _sample(0, ecc_uncorrected=0), "GPU-1": _sample(1)}
    expected = {"GPU-0", "GPU-1"}
    assert fault_seen([_sample(0, ecc_uncorrected=0), _sample(1)], before, expected) is None
    assert fault_seen([_sample(0), _sample(1, xid_errors=[13])], before, expected) is None  # an app's own fault
    assert fault_seen([_sample(0), _sample(1, xid_errors=[79])], before, expected) == "XID 79 on GPU 1"
    assert fault_seen([_sample(0, ecc_uncorrected=1), _sample(1)], before, expected) == (
        "new uncorrectable ECC error(s) on GPU 0")
    assert fault_seen([_sample(0)], before, expected) == "GPU 1 stopped answering"


def test_the_record_survives_a_restart_and_a_torn_one_asks_for_a_burn_in(tmp_path):
    path = tmp_path / "validation" / CLUSTER / f"{NODE}.json"
    record = record_of(sim(2))
    save(path, record)
    assert load(path) == record
    path.write_text("{ not json")
    assert load(path) is None


def test_wrong_gate_settings_are_named():
    with pytest.raises(ValidationError, match="validation_duration"):
        AgentSettings(validation_duration="soon")
    with pytest.raises(ValidationError, match="validation_checks"):
        AgentSettings(validation_checks="compute,vram")
    with pytest.raises(ValidationError, match="validation"):
        AgentSettings(validation="sometimes")
    assert AgentSettings(validation="first", validation_duration="30s").burn_in.duration_s == 30


# ------------------------------------------------------------------------------------------ on the bus


async def _registered(bus) -> NodeRegistered:
    msg = await bus.js.get_last_msg("WHALEFLUX_NODES", subjects.node_registered(CLUSTER, NODE))
    data = decode(msg.data)[1]
    assert isinstance(data, NodeRegistered)
    return data


async def _validated(bus) -> GpuValidated:
    msg = await bus.js.get_last_msg("WHALEFLUX_VALIDATIONS", subjects.gpu_validated(CLUSTER, NODE))
    data = decode(msg.data)[1]
    assert isinstance(data, GpuValidated)
    return data


async def _start(bus, tmp_path, backend: SimulatedNode, policy: str = "first") -> NodeAgent:
    node = FleetNode(name=NODE, group="h100", cluster=CLUSTER, rack="r1", pool="default", ownership="owned",
                     gpu_model="H100", gpus=backend.gpu_count, interconnect="nvlink")
    gate = NodeGate(CLUSTER, NODE, policy, make_plan(duration="2m"),  # type: ignore[arg-type]
                    tmp_path / "validation" / f"{NODE}.json", lambda _g: SimulatedExerciser(backend, datetime.now(UTC)))
    agent = NodeAgent(bus, node, backend, interval_s=0.2, log_dir=tmp_path / "jobs", attempts_dir=tmp_path / "attempts",
                      gate=gate)
    await agent.start()
    return agent


async def _restarted(bus, servers):
    """The agent process restarted: a new connection (the stopped agent's consumer loop ends with the old one)."""
    await bus.close()
    return await connect_bus(servers)


async def test_a_new_node_registers_only_the_gpus_that_passed_and_a_repaired_one_all(clean_servers, tmp_path):
    bus = await connect_bus(clean_servers)
    try:
        agent = await _start(bus, tmp_path, sim(4, "cooling:1"))
        registered = await _registered(bus)
        assert [g.index for g in registered.gpus] == [0, 2, 3]
        validated = await _validated(bus)
        assert validated.reason == "first registration: no burn-in on record" and validated.verdict == "fail"
        assert validated.quarantined == [validated.gpus[1].uuid] and validated.gpus[1].index == 1
        assert validated.gpus[1].reasons[0].startswith("compute: ")  # throttled, so slow
        assert [c.check for c in validated.gpus[0].checks] == ["compute", "memory", "bandwidth", "thermal", "health"]
        [shown] = TestClient(create_app([agent], AgentSettings())).get("/v1/nodes").json()
        assert shown["validation"]["state"] == "fail" and shown["validation"]["quarantined"] == [1]
        assert shown["validation"]["policy"] == "first" and shown["validation"]["fault"] is None
        first = load(tmp_path / "validation" / f"{NODE}.json")
        assert first is not None and first.report.gpus[1].verdict == "fail"
        await agent.stop()
        bus = await _restarted(bus, clean_servers)

        # The GPU was repaired (a node without the fault): its failure asks for another burn-in, which it passes.
        agent = await _start(bus, tmp_path, sim(4))
        assert [g.index for g in (await _registered(bus)).gpus] == [0, 1, 2, 3]
        again = await _validated(bus)
        assert again.reason == "GPU(s) 1 failed the last burn-in"
        assert again.verdict == "pass" and again.quarantined == []
        second = load(tmp_path / "validation" / f"{NODE}.json")
        assert second is not None and second.report.finished_at > first.report.finished_at
        await agent.stop()
        bus = await _restarted(bus, clean_servers)

        # A node that passed registers at once next time: no burn-in, the record unchanged.
        agent = await _start(bus, tmp_path, sim(4))
        assert load(tmp_path / "validation" / f"{NODE}.json") == second
        await agent.stop()
    finally:
        await bus.close()


async def test_a_gpu_fault_in_telemetry_goes_on_the_record(clean_servers, tmp_path):
    bus = await connect_bus(clean_servers)
    try:
        backend = sim(2)
        agent = await _start(bus, tmp_path, backend)
        backend.inject(Fault(kind="xid79", node=NODE, gpu=0))
        path = tmp_path / "validation" / f"{NODE}.json"
        faulted = await until(lambda: (r := load(path)) is not None and r.fault is not None and r, timeout=30,
                              what="the fault on the record")
        assert faulted.fault == "XID 79 on GPU 0" and faulted.fault_at is not None
        assert faulted.fault_at - faulted.report.finished_at < timedelta(hours=1)
        await agent.stop()
    finally:
        await bus.close()


async def test_a_burn_in_that_cannot_run_quarantines_every_gpu(tmp_path):
    backend = sim(2)

    def no_cuda(_gpus):
        raise RuntimeError("the GPU burn-in needs NVIDIA's cuda-bindings")

    gate = NodeGate(CLUSTER, NODE, "first", make_plan(duration="1m"), tmp_path / "v.json", no_cuda)
    admitted, _ = await gate.admit(backend, running_attempts=0)
    assert admitted == []
    record = load(tmp_path / "v.json")
    assert record is not None and [c.verdict for c in record.report.gpus] == ["fail", "fail"]
    assert record.report.gpus[0].reasons == [
        "health: the burn-in could not run: the GPU burn-in needs NVIDIA's cuda-bindings"]


async def test_healthz_fails_naming_a_placement_consumer_whose_loop_ended(clean_servers, tmp_path):
    bus = await connect_bus(clean_servers)
    try:
        node = FleetNode(name=NODE, group="h100", cluster=CLUSTER, rack="r1", pool="default", ownership="owned",
                         gpu_model="H100", gpus=2, interconnect="nvlink")
        agent = NodeAgent(bus, node, sim(2), interval_s=0.2, log_dir=tmp_path / "jobs",
                          attempts_dir=tmp_path / "attempts")
        await agent.start()
        client = TestClient(create_app([agent], AgentSettings()))
        assert client.get("/healthz").status_code == 200
        durable = f"agent-{CLUSTER}-{NODE}"
        _, loop = bus._consumers[durable]
        loop.cancel()  # the loop never ends on its own (shared/consumer.py); this stands for a bug that ends it
        await until(lambda: loop.done())
        answer = client.get("/healthz")
        assert answer.status_code == 503 and durable in answer.json()["detail"]
        await agent.stop()
    finally:
        await bus.close()
