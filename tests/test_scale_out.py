"""Services scaled out: the telemetry stream partitioned by node, partitions leased to replicas, handed over.

Pure parts first (assignment, the stream's subject transform, which consumers run in which unit), then
through real NATS and Redis: the server partitions as `partition_of` says, leases move between two
replicas, and two telemetry replicas share the partitions until one is killed -9 and the other takes over
with no sample lost or stored twice.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import httpx
import structlog

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuTelemetry, NodeRegistered
from whaleflux.shared.ownership import Ownership, Unit, plan
from whaleflux.shared.partition_store import PartitionStore
from whaleflux.shared.partitions import MAIN, PARTITIONS, assign, partition_of, units
from whaleflux.shared.permissions import service_identity
from whaleflux.shared.settings import CommonSettings
from whaleflux.shared.streams import CONSUMERS, STREAMS

from .processes import connect_bus, fetch_stored, make_cluster, wait_until
from .scaleout import both_holding, holders, instance

NODES = [f"n{i:02d}" for i in range(12)]


def test_assignment_is_deterministic_and_spreads_the_partitions():
    names = units()
    assert names == [MAIN, *(f"p{k}" for k in range(PARTITIONS))]
    one = assign(names, ["a"])
    assert set(one.values()) == {"a"}
    two = assign(names, ["b", "a"])
    assert two == assign(names, ["a", "b", "a"])  # order and repeats do not matter
    assert two[MAIN] == "a"
    counts = {m: sum(1 for u, owner in two.items() if owner == m and u != MAIN) for m in ("a", "b")}
    assert counts == {"a": PARTITIONS // 2, "b": PARTITIONS // 2}
    four = assign(names, ["a", "b", "c", "d"])
    assert sorted(owner for u, owner in four.items() if u != MAIN) == sorted(["a", "b", "c", "d"] * (PARTITIONS // 4))
    assert assign(names, []) == {}


def test_the_telemetry_stream_stores_each_batch_under_its_partition():
    spec = STREAMS["WHALEFLUX_TELEMETRY"]
    transform = spec.config().subject_transform
    assert transform is not None and transform.src == "gpu.telemetry.*.*"
    wildcards = "{{wildcard(1)}}.{{wildcard(2)}}"
    assert transform.dest == f"gpu.telemetry.{wildcards}.{{{{partition({PARTITIONS},1,2)}}}}"
    assert spec.partition_filter(3) == "gpu.telemetry.*.*.3"
    assert spec.published("gpu.telemetry.onprem.h100-01.3") == "gpu.telemetry.onprem.h100-01"
    assert spec.published("gpu.telemetry.onprem.h100-01") == "gpu.telemetry.onprem.h100-01"
    assert STREAMS["WHALEFLUX_JOBS"].config().subject_transform is None


def test_partitioned_consumers_run_one_durable_per_partition_and_the_rest_with_main():
    specs = {name: CONSUMERS[name] for name in ("telemetry-gpu", "telemetry-nodes", "telemetry-jobs")}
    planned = plan(specs)
    assert set(planned) == set(units())
    assert [name for name, _ in planned[MAIN]] == ["telemetry-nodes", "telemetry-jobs"]
    [(name, p5)] = planned["p5"]
    assert name == "telemetry-gpu" and p5.durable == "telemetry-gpu-p5"
    assert p5.filter_subjects == ["gpu.telemetry.*.*.5"] and p5.takeover and not p5.partitioned
    assert p5.batch * PARTITIONS == specs["telemetry-gpu"].batch  # all partitions fetch what one whole-feed fetch does
    # The service's NATS identity may run every partition's consumer.
    identity = service_identity("telemetry")
    assert identity.may_publish("$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_TELEMETRY.telemetry-gpu-p5")
    assert not identity.may_publish("$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_TELEMETRY.alerting-telemetry-p5")


async def test_the_server_partitions_nodes_as_partition_of_says(bus_and_redis):
    bus, _ = bus_and_redis
    for node in NODES:
        await bus.js.publish(subjects.gpu_telemetry("onprem", node), b"{}")
    sub = await bus.js.pull_subscribe(f"{subjects.GPU_TELEMETRY}.>", stream="WHALEFLUX_TELEMETRY")
    stored = await fetch_stored(sub)
    assert len(stored) == len(NODES)
    for msg in stored:
        _, _, cluster, node, k = msg.subject.split(".")
        assert int(k) == partition_of(cluster, node), msg.subject
    assert len({partition_of("onprem", n) for n in NODES}) > 1  # the nodes spread over partitions


async def test_leases_move_to_the_replica_assigned_and_back_when_one_leaves(bus_and_redis):
    _, redis = bus_and_redis
    store = PartitionStore(redis, "wf:test")
    runs: dict[str, set[str]] = {"a": set(), "b": set()}

    def replica(name: str) -> Ownership:
        def unit(u: str) -> Unit:
            async def stop() -> None:
                runs[name].discard(u)
            return Unit(start=lambda: runs[name].add(u), stop=stop)
        settings = CommonSettings(instance=name, partition_lease_s=1.0)
        return Ownership(store, settings, {u: unit(u) for u in units()}, structlog.get_logger("test"))

    a, b = replica("a"), replica("b")
    await a.tick()
    assert runs["a"] == set(units())  # alone: everything
    await b.tick()  # b joins: its units are still a's
    assert runs["b"] == set()
    await a.tick()  # a sees b, stops and gives up b's share
    await b.tick()
    assert runs["a"] | runs["b"] == set(units()) and not runs["a"] & runs["b"]
    assert MAIN in runs["a"] and len(runs["b"]) == PARTITIONS // 2
    await b.leave()  # b stops: out of the members, leases given up at once
    assert runs["b"] == set()
    await a.tick()
    assert runs["a"] == set(units())


def _batch(node: SimulatedNode, name: str, seq: int, t: datetime) -> GpuTelemetry:
    return GpuTelemetry(cluster="onprem", node=name, seq=seq, sample_time=t, gpus=node.sample(t))


def test_two_telemetry_replicas_share_the_partitions_and_one_takes_over_when_the_other_is_killed(
        clean_servers, tmp_path):
    servers = clean_servers
    system = make_cluster(servers, tmp_path)
    scaled = {"WHALEFLUX_SCALE_OUT": "true", "WHALEFLUX_PARTITION_LEASE_S": "3"}
    nodes = {name: SimulatedNode(name, gpu_models()["H100"], 2, interconnect="nvlink") for name in NODES}
    rounds, kill_at = 30, 10
    try:
        async def register() -> None:
            bus = await connect_bus(servers)
            try:
                for name, node in nodes.items():
                    await bus.publish(subjects.node_registered("onprem", name),
                                      NodeRegistered(cluster="onprem", node=name, agent_version="t",
                                                     gpus=node.identities()))
            finally:
                await bus.close()

        asyncio.run(register())
        first, second = system.service("telemetry", "a", **scaled), system.service("telemetry", "b", **scaled)
        first.wait_ready()
        second.wait_ready()
        shared = both_holding(servers, "telemetry")
        # The one not holding `main` is killed: its partitions must move, and `main` stays.
        victim = first if instance(first) != shared[MAIN] else second
        survivor = second if victim is first else first

        async def publish() -> datetime:
            bus = await connect_bus(servers)
            began = datetime.now(UTC)
            try:
                for r in range(rounds):
                    if r == kill_at:
                        victim.kill9()
                    t = began + timedelta(seconds=r * 0.25)
                    for name, node in nodes.items():
                        await bus.publish(subjects.gpu_telemetry("onprem", name), _batch(node, name, r + 1, t))
                    await asyncio.sleep(0.25)
                return began
            finally:
                await bus.close()

        began = asyncio.run(publish())
        survivor_instance = instance(survivor)
        wait_until(lambda: set(asyncio.run(holders(servers, "telemetry")).values()) == {survivor_instance}, timeout=60,
                   what="the survivor holding every partition")
        uuids = [g.uuid for node in nodes.values() for g in node.identities()]

        def points(uuid: str) -> list[float]:
            answer = httpx.get(f"{survivor.url}/v1/gpus/{uuid}/history", timeout=10, params={
                "resolution": "raw", "since": (began - timedelta(seconds=1)).isoformat(),
                "until": (began + timedelta(minutes=5)).isoformat()})
            answer.raise_for_status()
            return [p["t"] for p in answer.json()["points"]]

        wait_until(lambda: all(len(points(u)) >= rounds for u in uuids), timeout=90, what="every sample stored")
        for uuid in uuids:
            got = points(uuid)
            assert len(got) == rounds == len(set(got)), uuid  # none lost, none stored twice

        async def dead_letters() -> list[str]:
            bus = await connect_bus(servers)
            try:
                sub = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", stream="WHALEFLUX_DEADLETTER")
                return [m.headers.get("WhaleFlux-Reason", "") for m in await fetch_stored(sub)]
            finally:
                await bus.close()

        # A batch the killed replica stored but never acked comes again and is refused as a duplicate; none
        # arrives after a newer one (out of order), which would have lost it.
        reasons = asyncio.run(dead_letters())
        assert not [r for r in reasons if "out_of_order" in r], reasons
        assert all("duplicate" in r for r in reasons), reasons
    finally:
        system.stop()


def test_two_alerting_replicas_raise_and_resolve_each_gpu_alert_once_across_a_kill(clean_servers, tmp_path):
    servers = clean_servers
    system = make_cluster(servers, tmp_path)
    scaled = {"WHALEFLUX_SCALE_OUT": "true", "WHALEFLUX_PARTITION_LEASE_S": "3"}
    nodes = {name: SimulatedNode(name, gpu_models()["H100"], 2, interconnect="nvlink") for name in NODES}
    hot_uuid = {name: node.identities()[0].uuid for name, node in nodes.items()}
    try:
        first, second = system.service("alerting", "a", **scaled), system.service("alerting", "b", **scaled)
        first.wait_ready()
        second.wait_ready()
        shared = both_holding(servers, "alerting")
        victim = first if instance(first) != shared[MAIN] else second
        survivor = second if victim is first else first

        def sample(name: str, t: datetime, phase: str) -> GpuTelemetry:
            batch = _batch(nodes[name], name, 0, t)
            gpus = [g.model_copy(update={"temperature_c": 95.0, "slowdown_temperature_c": None})
                    if phase == "hot" and g.uuid == hot_uuid[name] else
                    g.model_copy(update={"temperature_c": 40.0, "utilization_gpu_pct": 90.0})
                    for g in batch.gpus]
            return batch.model_copy(update={"gpus": gpus})

        async def publish(phase: str, rounds: int, seq0: int, kill_after: int | None = None) -> None:
            bus = await connect_bus(servers)
            try:
                for r in range(rounds):
                    if r == kill_after:
                        victim.kill9()
                    t = datetime.now(UTC)
                    for name in nodes:
                        batch = sample(name, t, phase).model_copy(update={"seq": seq0 + r})
                        await bus.publish(subjects.gpu_telemetry("onprem", name), batch)
                    await asyncio.sleep(0.3)
            finally:
                await bus.close()

        async def alerts() -> tuple[Counter[str], Counter[str]]:
            bus = await connect_bus(servers)
            try:
                sub = await bus.js.pull_subscribe("alert.>", stream="WHALEFLUX_ALERTS")
                raised: Counter[str] = Counter()
                resolved: Counter[str] = Counter()
                for msg in await fetch_stored(sub):
                    data = json.loads(msg.data)["data"]
                    if data["rule"] == "GPUTemperatureHigh":
                        (raised if msg.subject == subjects.ALERT_RAISED else resolved)[data["labels"]["UUID"]] += 1
                return raised, resolved
            finally:
                await bus.close()

        asyncio.run(publish("cool", 3, 1))
        asyncio.run(publish("hot", 12, 10, kill_after=4))  # hot before and after the kill
        survivor_instance = instance(survivor)
        wait_until(lambda: set(asyncio.run(holders(servers, "alerting")).values()) == {survivor_instance},
                   timeout=60, what="the survivor holding every partition")
        wait_until(lambda: set(asyncio.run(alerts())[0]) == set(hot_uuid.values()), timeout=60,
                   what="every hot GPU raised")
        asyncio.run(publish("cool", 6, 100))
        wait_until(lambda: set(asyncio.run(alerts())[1]) == set(hot_uuid.values()), timeout=60,
                   what="every alert resolved")
        raised, resolved = asyncio.run(alerts())
        assert raised == {uuid: 1 for uuid in hot_uuid.values()}  # none lost, none raised twice
        assert resolved == {uuid: 1 for uuid in hot_uuid.values()}
    finally:
        system.stop()
