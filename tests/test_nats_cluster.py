"""WhaleFlux on a three-server NATS JetStream cluster: R3 streams, one server killed under load.

The cluster is three real nats-server processes from the pip wheel (whaleflux.servers.NatsCluster), clustered
on loopback, with the same authorization block a single server gets.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import nats.errors
import pytest
from nats.js.errors import ServiceUnavailableError

from whaleflux.servers import LocalServers
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus, nats_servers
from whaleflux.shared.events import JobSubmitted
from whaleflux.shared.settings import CommonSettings
from whaleflux.shared.streams import STREAMS, agent_consumer

from .conftest import Servers
from .processes import fetch_stored, make_cluster, until, wait_until

JOBS = 24


def test_streams_are_declared_with_the_replica_count():
    assert STREAMS["WHALEFLUX_JOBS"].config().num_replicas == 1
    assert STREAMS["WHALEFLUX_JOBS"].config(3).num_replicas == 3


def test_replicas_setting_defaults_to_one_and_is_bounded(monkeypatch):
    monkeypatch.delenv("WHALEFLUX_NATS_REPLICAS", raising=False)
    assert CommonSettings().nats_replicas == 1
    monkeypatch.setenv("WHALEFLUX_NATS_REPLICAS", "3")
    assert CommonSettings().nats_replicas == 3
    monkeypatch.setenv("WHALEFLUX_NATS_REPLICAS", "0")
    with pytest.raises(ValueError, match="nats_replicas"):
        CommonSettings()


def test_nats_url_lists_every_server_of_a_cluster():
    assert nats_servers("nats://a:4222") == ["nats://a:4222"]
    assert nats_servers("nats://a:4222, nats://b:4222,nats://c:4222") == ["nats://a:4222", "nats://b:4222",
                                                                          "nats://c:4222"]
    with pytest.raises(ValueError, match="no server"):
        nats_servers(" , ")


@pytest.fixture
def nats_cluster(tmp_path: Path):
    local = LocalServers(tmp_path / "servers", "whaleflux", secrets.token_urlsafe(16), secrets.token_urlsafe(16),
                         nats_cluster=3).start()
    try:
        yield local
    finally:
        local.stop()


def _servers(local: LocalServers) -> Servers:
    return Servers(local.nats_url, local.redis_url, local.nats_user, local.nats_password, local.redis_password,
                   "cluster")


def _job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, team="t", command=["true"], gpus=1, submitted_by="test")


async def _publish_until_stored(bus: Bus, job_id: str) -> tuple[float, int]:
    """Publish a submission as a careful client does: the same event again until JetStream acknowledges it.
    Returns the seconds it took and the number of tries."""
    env = bus.envelope(_job(job_id), subject=job_id, event_id=f"submit-{job_id}", correlation_id=job_id)
    began, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            await bus.publish_envelope(subjects.JOB_SUBMITTED, env)
            return time.monotonic() - began, tries
        except (nats.errors.Error, TimeoutError, OSError):  # the failover: no responders, timeout; publish again
            await asyncio.sleep(0.2)


async def _stored(bus: Bus, stream: str, subject: str) -> list:
    """Every message of `stream` on `subject` (the stream is quiet by now: the publishers stopped)."""
    sub = await bus.js.pull_subscribe(subject, stream=stream)

    async def led() -> bool:  # a new R3 consumer answers fetches once its leader is elected (a 503 until then)
        try:
            info = await sub.consumer_info()
        except (ServiceUnavailableError, TimeoutError):
            return False
        return info.cluster is not None and bool(info.cluster.leader)

    try:
        await until(led, timeout=60, what=f"a leader for the consumer reading {stream}")
        return await fetch_stored(sub)
    finally:
        await sub.unsubscribe()


async def _cluster_bus(servers: Servers) -> Bus:
    bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)
    bus.js = bus.nc.jetstream(timeout=30)  # a loaded test machine answers slowly; the deadline only catches a hang
    return bus


def _leader(local: LocalServers, stream: str, durable: str | None = None) -> int:
    """Which server leads the stream (or, given `durable`, that consumer of it), as an index of the cluster."""
    async def ask() -> str:
        bus = await _cluster_bus(_servers(local))
        try:
            info = await (bus.js.consumer_info(stream, durable) if durable else bus.js.stream_info(stream))
            assert info.cluster is not None and info.cluster.leader
            return str(info.cluster.leader)
        finally:
            await bus.close()

    leader = asyncio.run(ask())
    assert local.cluster is not None
    return next(i for i in range(local.cluster.size) if local.cluster.server_name(i) == leader)


def test_killing_one_server_under_load_loses_nothing_and_it_catches_up(nats_cluster, tmp_path):
    local = nats_cluster
    assert local.cluster is not None
    servers = _servers(local)
    system = make_cluster(servers, tmp_path)
    system.base_env["WHALEFLUX_NATS_REPLICAS"] = "3"
    for name in ("telemetry", "scheduler"):
        system.service(name)
    system.agent("r4090-01", "h100-01", interval_s=0.5)
    try:
        for name in ("telemetry", "scheduler"):
            system.procs[name].wait_ready()
        telemetry = system.procs["telemetry"]
        wait_until(lambda: len(httpx.get(telemetry.url + "/v1/gpus", timeout=5).json()) == 12, what="telemetry")
        victim = _leader(local, "WHALEFLUX_JOBS")

        async def load() -> dict:
            bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user,
                                    password=servers.nats_password, replicas=3)
            waits: list[float] = []
            try:
                info = await bus.js.stream_info("WHALEFLUX_JOBS")
                assert info.config.num_replicas == 3
                assert info.cluster is not None and len(info.cluster.replicas or []) == 2
                for i in range(JOBS):
                    if i == JOBS // 3:
                        local.cluster.kill9(victim)  # the JOBS stream's leader: the worst server to lose
                    waited, _ = await _publish_until_stored(bus, f"cl-{i:03d}")
                    waits.append(waited)
                    await asyncio.sleep(0.1)
                return {"waits": waits}
            finally:
                await bus.close()

        result = asyncio.run(load())
        # Every job runs once, to the end, with a server down.
        scheduler = system.procs["scheduler"]

        def states() -> dict[str, str]:
            return {f"cl-{i:03d}": httpx.get(f"{scheduler.url}/v1/jobs/cl-{i:03d}", timeout=5).json().get("state")
                    for i in range(JOBS)}

        wait_until(lambda: set(states().values()) == {"succeeded"}, timeout=120, what="every job succeeded")
        stored_before_restart = _samples_stored(telemetry.url)
        local.cluster.restart(victim)
        local.cluster.wait_current(victim)  # healthz: its streams caught up with the cluster
        # Telemetry kept storing across the failover, and goes on.
        wait_until(lambda: _samples_stored(telemetry.url) > stored_before_restart, what="telemetry goes on")
        system.procs["agent"].stop()  # the streams stop growing: what they hold can be read to the end

        async def check() -> tuple[list, list, list, dict]:
            bus = await _cluster_bus(servers)
            try:
                submitted = await _stored(bus, "WHALEFLUX_JOBS", subjects.JOB_SUBMITTED)
                started = await _stored(bus, "WHALEFLUX_JOBS", f"{subjects.JOB_STARTED}.>")
                samples = await _stored(bus, "WHALEFLUX_TELEMETRY", f"{subjects.GPU_TELEMETRY}.>")
                peers = {}
                for stream in ("WHALEFLUX_JOBS", "WHALEFLUX_TELEMETRY"):
                    cluster = (await bus.js.stream_info(stream)).cluster
                    assert cluster is not None
                    peers[stream] = {p.name: p.current for p in cluster.replicas or []} | {cluster.leader: True}
                return submitted, started, samples, peers
            finally:
                await bus.close()

        submitted, started, samples, peers = asyncio.run(check())
        ids = Counter(json.loads(m.data)["data"]["job_id"] for m in submitted)
        assert ids == {f"cl-{i:03d}": 1 for i in range(JOBS)}  # each submission stored once, none lost
        runs = Counter(json.loads(m.data)["data"]["job_id"] for m in started)
        assert runs == {f"cl-{i:03d}": 1 for i in range(JOBS)}  # no job ran twice
        # No telemetry batch lost: each node's batch numbers run without a gap across the failover.
        seqs: dict[str, list[int]] = defaultdict(list)
        for msg in samples:
            data = json.loads(msg.data)["data"]
            seqs[data["node"]].append(data["seq"])
        assert set(seqs) == {"r4090-01", "h100-01"}
        for node, got in seqs.items():
            assert sorted(set(got)) == list(range(min(got), max(got) + 1)), f"{node} lost telemetry batches"
        # The restarted server holds its copy again, current with the leader.
        victim_name = local.cluster.server_name(victim)
        for stream, current in peers.items():
            assert current.get(victim_name) is True, (stream, current)
        assert len(result["waits"]) == JOBS  # publishing resumed (how soon: bench/nats_failover.py)
    finally:
        system.stop()


def _samples_stored(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("whaleflux_telemetry_gpu_samples_stored_total "):
            return float(line.split()[1])
    raise AssertionError("no whaleflux_telemetry_gpu_samples_stored_total on /metrics")


def test_killing_the_server_that_leads_an_agents_consumer_stops_no_job(nats_cluster, tmp_path):
    """The agent's own placement consumer loses its leader: the placements made after the kill still start."""
    local = nats_cluster
    assert local.cluster is not None
    servers = _servers(local)
    system = make_cluster(servers, tmp_path)
    system.base_env["WHALEFLUX_NATS_REPLICAS"] = "3"
    system.service("scheduler")
    system.agent("r4090-01", interval_s=0.5)  # one node: every job is placed through this one consumer
    scheduler = system.procs["scheduler"]

    def state(job_id: str) -> str | None:
        return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}", timeout=5).json().get("state")

    async def submit(job_ids: list[str]) -> None:
        bus = await _cluster_bus(servers)
        try:
            for job_id in job_ids:
                await _publish_until_stored(bus, job_id)
        finally:
            await bus.close()

    try:
        scheduler.wait_ready()
        asyncio.run(submit(["lead-before"]))  # the consumer exists and delivers before the kill
        wait_until(lambda: state("lead-before") == "succeeded", timeout=120, what="the job before the kill")
        victim = _leader(local, "WHALEFLUX_JOBS", agent_consumer("onprem", "r4090-01").durable)
        local.cluster.kill9(victim)
        after = [f"lead-after-{i}" for i in range(8)]
        asyncio.run(submit(after))
        wait_until(lambda: all(state(j) == "succeeded" for j in after), timeout=180,
                   what="every job placed after the kill started and succeeded")
        assert _leader(local, "WHALEFLUX_JOBS", agent_consumer("onprem", "r4090-01").durable) != victim
        system.procs["agent"].stop()

        async def started() -> list:
            bus = await _cluster_bus(servers)
            try:
                return await _stored(bus, "WHALEFLUX_JOBS", f"{subjects.JOB_STARTED}.>")
            finally:
                await bus.close()

        runs = Counter(json.loads(m.data)["data"]["job_id"] for m in asyncio.run(started()))
        assert runs == {job_id: 1 for job_id in ["lead-before", *after]}  # each started once, on the one node
    finally:
        system.stop()
