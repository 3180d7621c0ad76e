"""Bad input through a real service: dead-lettered with a reason, counted, and the service goes on."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime

import httpx

from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER, Bus
from whaleflux.shared.events import GpuIdentity, GpuSample, GpuTelemetry, NodeRegistered, make_envelope

from .processes import fetch_at_least, make_cluster, wait_until

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def _sample(**over) -> dict:
    base = dict(uuid=GPU, index=0, model="A100", utilization_gpu_pct=50, memory_used_mib=1000,
                memory_total_mib=81920, temperature_c=40)
    return {**base, **over}


async def _send_bad_then_good(servers) -> list[tuple[str, str]]:
    bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)
    try:
        identity = GpuIdentity(uuid=GPU, index=0, model="A100", name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920)
        await bus.publish(
            subjects.node_registered("onprem", "dl-node"),
            NodeRegistered(cluster="onprem", node="dl-node", agent_version="test", gpus=[identity]),
        )
        subject = subjects.gpu_telemetry("onprem", "dl-node")
        now = datetime.now(UTC)
        # 1. not JSON at all
        await bus.js.publish(subject, b"\x00not json{")
        # 2. schema violation: negative memory
        valid = GpuTelemetry(cluster="onprem", node="dl-node", seq=1, sample_time=now, gpus=[GpuSample(**_sample())])
        bad_doc = json.loads(make_envelope(valid, source="test", time=now).model_dump_json())
        bad_doc["data"]["gpus"][0]["memory_used_mib"] = -5
        await bus.js.publish(subject, json.dumps(bad_doc).encode())
        # 3. a GPU the node never registered
        await bus.publish(subject, GpuTelemetry(cluster="onprem", node="dl-node", seq=2, sample_time=now,
                                                gpus=[GpuSample(**_sample(uuid="GPU-not-registered"))]))
        # 4. a good sample after all that
        await bus.publish(subject, GpuTelemetry(cluster="onprem", node="dl-node", seq=3, sample_time=now,
                                                gpus=[GpuSample(**_sample(temperature_c=41.5))]))

        dead = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", durable="test-dl",
                                           stream="WHALEFLUX_DEADLETTER")
        got = await fetch_at_least(dead, 3)
        return [(m.subject, m.headers[REASON_HEADER]) for m in got]
    finally:
        await bus.close()


def test_malformed_events_are_deadlettered_counted_and_processing_continues(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    telemetry = cluster.service("telemetry")
    try:
        telemetry.wait_ready()
        dead = asyncio.run(_send_bad_then_good(clean_servers))
        assert [s for s, _ in dead] == ["deadletter.gpu.telemetry.onprem.dl-node"] * 3
        reasons = [r for _, r in dead]
        assert reasons[0].startswith("not JSON")
        assert "memory_used_mib" in reasons[1] and "greater than or equal to 0" in reasons[1]
        assert "unknown GPU uuid" in reasons[2] and "GPU-not-registered" in reasons[2]

        # The good sample after the bad ones was stored.
        latest = wait_until(lambda: httpx.get(f"{telemetry.url}/v1/gpus/{GPU}").json(), what="good sample")
        assert latest["gpu"]["temperature_c"] == 41.5 and latest["seq"] == 3

        metrics = httpx.get(f"{telemetry.url}/metrics").text
        def count(stage):
            pattern = rf'whaleflux_events_deadlettered_total{{consumer="telemetry-gpu",stage="{stage}"}} (\S+)'
            m = re.search(pattern, metrics)
            return float(m.group(1)) if m else 0.0
        assert count("validation") == 2.0
        assert count("rejected") == 1.0
        assert telemetry.popen is not None and telemetry.popen.poll() is None  # still running
    finally:
        cluster.stop()
