"""Telemetry through real NATS and Redis, in-process with an injected clock.

History, rollups, job usage, bad sequences, /metrics.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared import subjects
from whaleflux.shared.bus import REASON_HEADER, Bus
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuTelemetry, JobFinished, JobPlaced, JobStarted, JobSubmitted, NodeRegistered
from whaleflux.telemetry.app import TelemetrySettings, build
from whaleflux.telemetry.history import Point, rollup

from .processes import Clock, fetch_at_least, until

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


async def test_history_rollups_job_usage_and_bad_sequences(env):
    clock = Clock(T0)
    app, svc = build(TelemetrySettings(maintenance_interval_s=3600, raw_retention_s=3600), clock=clock)
    await svc.start()
    bus = await Bus.connect(env.nats_url, source="test", user=env.nats_user, password=env.nats_password)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://telemetry")
    try:
        consumers = {"telemetry-gpu", "telemetry-jobs", "telemetry-nodes"}
        await until(lambda: asyncio.sleep(0, consumers <= svc.runtime.bus.bound), what="consumers")
        node = SimulatedNode("h100-01", gpu_models()["H100"], 2, interconnect="nvlink")
        busy, idle = [g.uuid for g in node.identities()]
        await bus.publish(subjects.node_registered("onprem", "h100-01"),
                          NodeRegistered(cluster="onprem", node="h100-01", agent_version="t", gpus=node.identities()))
        await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(
            job_id="llama", name="llama-ft", team="nlp", project="llm", command=["x"]))
        await bus.publish(subjects.job_placed("onprem", "h100-01"), JobPlaced(
            job_id="llama", attempt=1, cluster="onprem", node="h100-01", gpu_model="H100", gpu_uuids=[busy],
            gpu_indices=[0], command=["x"], team="nlp", project="llm"))
        started = T0 + timedelta(seconds=10)
        await bus.publish(subjects.job_started("onprem", "h100-01"), JobStarted(
            job_id="llama", attempt=1, cluster="onprem", node="h100-01", gpu_uuids=[busy], pid=1, started_at=started))

        # 130 one-second batches; the job holds GPU 0 from t=10 to t=100.
        node.job_started([busy], "llama", pid=1)
        batches = []
        for i in range(130):
            t = T0 + timedelta(seconds=i)
            if i == 100:
                node.job_stopped([busy])
            batches.append(GpuTelemetry(cluster="onprem", node="h100-01", seq=i + 1, sample_time=t,
                                        gpus=node.sample(t)))
        clock.now = T0 + timedelta(seconds=130)
        for b in batches:
            await bus.publish(subjects.gpu_telemetry("onprem", "h100-01"), b)
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id="llama", attempt=1, cluster="onprem", node="h100-01", exit_code=0, started_at=started,
            finished_at=T0 + timedelta(seconds=100)))
        # A duplicate and an out-of-order batch are dead-lettered with the reason and counted.
        await bus.publish(subjects.gpu_telemetry("onprem", "h100-01"), batches[-1])
        await bus.publish(subjects.gpu_telemetry("onprem", "h100-01"), batches[50])
        # An agent restart (seq from 1 again, newer sample time) is accepted.
        restarted = GpuTelemetry(cluster="onprem", node="h100-01", seq=1, sample_time=T0 + timedelta(seconds=130),
                                 gpus=node.sample(T0 + timedelta(seconds=130)))
        await bus.publish(subjects.gpu_telemetry("onprem", "h100-01"), restarted)

        async def stored():
            return svc.stored._value.get() >= 131 * 2
        await until(stored, what="all samples stored")
        dead = await bus.js.pull_subscribe(f"{subjects.DEADLETTER_PREFIX}.>", durable="t-dl",
                                           stream="WHALEFLUX_DEADLETTER")
        msgs = await fetch_at_least(dead, 2)
        reasons = [m.headers[REASON_HEADER] for m in msgs]
        assert reasons[0].startswith("duplicate_seq: seq 130") and reasons[1].startswith("out_of_order: seq 51")
        metrics = (await http.get("/metrics")).text
        for reason in ("duplicate_seq", "out_of_order", "seq_reset"):
            m = re.search(rf'whaleflux_telemetry_batches_flagged_total{{reason="{reason}"}} (\S+)', metrics)
            assert m and float(m.group(1)) == 1.0, reason

        # Raw history: one point per second.
        hist = (await http.get(f"/v1/gpus/{busy}/history", params={"since": T0.isoformat()})).json()
        assert hist["resolution"] == "raw" and len(hist["points"]) == 131
        backwards = {"since": "2026-12-01T13:00:00Z", "until": T0.isoformat()}
        answer = await http.get(f"/v1/gpus/{busy}/history", params=backwards)
        assert answer.status_code == 400 and answer.json()["detail"] == "since: must be before until"
        assert (await http.get(f"/v1/gpus/{busy}/history", params={"since": "yesterday"})).status_code == 422

        # Per-job usage over the run only (t=10..100), at ~92 % on the busy GPU.
        usage = await until(lambda: _json(http, "/v1/jobs/llama/usage"), what="usage")
        assert usage["gpus"] == 1 and usage["samples"] == 91
        assert 80 < usage["util_mean_pct"] < 100 and usage["util_peak_pct"] <= 100
        assert usage["energy_j"] == pytest.approx(90 * 650, rel=0.1) and usage["complete"] is True
        assert (await http.get("/v1/jobs/nope/usage")).status_code == 404

        # Minute rollups: ingest rolled the minutes its batches completed, the sweep rolls the
        # last one of the node that fell silent (once); then raw is trimmed, rollups answer.
        raw = [Point(**p) for p in hist["points"]]
        minutes = [T0.timestamp() + 60 * i for i in range(3)]
        expected = [r.as_dict() for m in minutes if (r := rollup(m, [p for p in raw if m <= p.t < m + 60]))]
        assert len(expected) == 3
        by_minute = {"since": T0.isoformat(), "resolution": "1m"}
        by_ingest = (await http.get(f"/v1/gpus/{busy}/history", params=by_minute)).json()
        assert by_ingest["points"][0] == pytest.approx(expected[0])  # the batches at 65-95 s rolled the first minute
        clock.now = T0 + timedelta(minutes=10)
        await svc.ingest.roll_and_trim()
        await svc.ingest.roll_and_trim()  # nothing is rolled twice
        clock.now = T0 + timedelta(hours=2)
        await svc.ingest.roll_and_trim()  # raw points are past their retention now
        old = (await http.get(f"/v1/gpus/{busy}/history", params={"since": T0.isoformat()})).json()
        assert old["resolution"] == "1m" and [p["n"] for p in old["points"]] == [60, 60, 11]
        assert old["points"] == [pytest.approx(r) for r in expected]  # what history.rollup() makes of the raw points
        raw_only = {"since": T0.isoformat(), "resolution": "raw"}
        assert (await http.get(f"/v1/gpus/{busy}/history", params=raw_only)).json()["points"] == []
        assert (await _json(http, "/v1/jobs/llama/usage")) == usage  # stored when the job settled

        # The latest sample is stale by now: the API flags it and /metrics leaves it out.
        gpus = (await http.get("/v1/gpus")).json()
        assert all(g["stale"] and "stale" in g["flags"] for g in gpus)
        assert "DCGM_FI_DEV_GPU_UTIL" not in (await http.get("/metrics")).text
    finally:
        await http.aclose()
        await bus.close()
        await svc.stop()


async def _json(http, path):
    resp = await http.get(path)
    return resp.json() if resp.status_code == 200 else None


async def test_metrics_carry_job_labels_while_the_job_holds_the_gpu(env):
    clock = Clock(T0)
    app, svc = build(TelemetrySettings(maintenance_interval_s=3600), clock=clock)
    await svc.start()
    bus = await Bus.connect(env.nats_url, source="test", user=env.nats_user, password=env.nats_password)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://telemetry")
    try:
        node = SimulatedNode("a100-01", gpu_models()["A100"], 2)
        uuids = [g.uuid for g in node.identities()]
        await bus.publish(subjects.node_registered("onprem", "a100-01"),
                          NodeRegistered(cluster="onprem", node="a100-01", agent_version="t", gpus=node.identities()))
        await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(job_id="j1", name="bert", team="search", project="rank",
                                                              command=["x"]))
        await bus.publish(subjects.job_placed("onprem", "a100-01"), JobPlaced(
            job_id="j1", attempt=1, cluster="onprem", node="a100-01", gpu_model="A100", gpu_uuids=[uuids[1]],
            gpu_indices=[1], command=["x"], team="search", project="rank"))
        await bus.publish(subjects.gpu_telemetry("onprem", "a100-01"),
                          GpuTelemetry(cluster="onprem", node="a100-01", seq=1, sample_time=T0, gpus=node.sample(T0)))

        async def labelled():
            text = (await http.get("/metrics")).text
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            util = fams.get("DCGM_FI_DEV_GPU_UTIL")
            return util and len(util.samples) == 2 and any("hpc_job" in s.labels for s in util.samples) and util
        util = await until(labelled, what="hpc_job label on /metrics")
        by_gpu = {s.labels["gpu"]: s.labels for s in util.samples}
        assert "hpc_job" not in by_gpu["0"] and not any("job" in lab for lab in by_gpu.values())
        assert (by_gpu["1"]["hpc_job"], by_gpu["1"]["team"], by_gpu["1"]["project"]) == ("j1", "search", "rank")
        assert by_gpu["1"]["modelName"] == "NVIDIA A100-SXM4-80GB" and by_gpu["1"]["Hostname"] == "a100-01"
        [g1] = [g for g in (await http.get("/v1/gpus", params={"node": "a100-01"})).json() if g["gpu"]["index"] == 1]
        assert g1["job"] == {"job_id": "j1", "name": "bert", "team": "search", "project": "rank"}

        fleet = (await http.get("/v1/fleet")).json()
        assert fleet["gpus"] == 2 and fleet["nodes"] == 1 and fleet["with_job"] == 1
        assert fleet["by_model"]["A100"]["gpus"] == 2
        nodes = (await http.get("/v1/nodes")).json()
        assert [n["node"] for n in nodes] == ["a100-01"] and nodes[0]["gpus"] == 2
        assert (await http.get("/v1/nodes/nope")).status_code == 404

        # The job moves to its second attempt on the same GPU; the first attempt's end, arriving
        # late, does not take the GPU from the second (the shared GPU-holder fold).
        await bus.publish(subjects.job_placed("onprem", "a100-01"), JobPlaced(
            job_id="j1", attempt=2, cluster="onprem", node="a100-01", gpu_model="A100", gpu_uuids=[uuids[1]],
            gpu_indices=[1], command=["x"], team="search", project="rank"))
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id="j1", attempt=1, cluster="onprem", node="a100-01", exit_code=0, started_at=T0,
            finished_at=T0 + timedelta(seconds=1)))
        # A marker behind it on the same stream: once it is stored, the late end was handled.
        await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(job_id="marker", name="m", command=["x"]))
        await until(lambda: svc.store.run("marker"), what="the late end handled")
        assert (await svc.store.job_holds("j1")).attempt == 2
        run = await svc.store.run("j1")
        assert run is not None and run.attempt == 2 and run.finished_at is None  # the run is attempt 2's
        [g1] = [g for g in (await http.get("/v1/gpus", params={"node": "a100-01"})).json() if g["gpu"]["index"] == 1]
        assert g1["job"]["job_id"] == "j1"
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id="j1", attempt=2, cluster="onprem", node="a100-01", exit_code=0, started_at=T0,
            finished_at=T0 + timedelta(seconds=1)))

        async def unlabelled():
            text = (await http.get("/metrics")).text
            return "DCGM_FI_DEV_GPU_UTIL" in text and 'hpc_job="j1"' not in text
        await until(unlabelled, what="job label gone after the job finished")
    finally:
        await http.aclose()
        await bus.close()
        await svc.stop()
