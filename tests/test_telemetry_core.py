"""The telemetry service's pure core: sequence checks, rollups, job usage, the DCGM exposition."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuSample, GpuTelemetry, JobFailed, JobFinished, JobPlaced, JobStarted, JobSubmitted
from whaleflux.telemetry import dcgm
from whaleflux.telemetry.admission import Last, Refused, Verdict, admit, gone_and_back, judge
from whaleflux.telemetry.history import Point, Rollup, minutes_to_roll, resolution_for, roll_offset
from whaleflux.telemetry.history import rollup as rollup_or_none
from whaleflux.telemetry.jobs import JobRun, apply
from whaleflux.telemetry.store_script import decode_last, encode_last
from whaleflux.telemetry.usage import from_points, from_rollups

DATA = Path(__file__).parent / "data" / "dcgm"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def rollup(minute_start: float, points: list[Point]) -> Rollup:
    """The rollup of a minute that has points."""
    r = rollup_or_none(minute_start, points)
    assert r is not None
    return r


# --------------------------------------------------------------------------- sequence numbers


@pytest.mark.parametrize(
    ("seq", "t", "verdict"),
    [
        (11, 101.0, Verdict.NEW),
        (10, 100.0, Verdict.DUPLICATE),
        (9, 99.0, Verdict.OUT_OF_ORDER),
        (12, 99.0, Verdict.OUT_OF_ORDER),  # a higher number but an older sample time
        (1, 500.0, Verdict.RESTART),  # the agent restarted and counts from 1 again
    ],
)
def test_sequence_numbers_are_judged_against_the_last_stored_batch(seq, t, verdict):
    assert judge(Last(10, 100.0), seq, t) is verdict


def test_first_batch_of_a_node_is_new():
    assert judge(None, 7, 1.0) is Verdict.NEW
    assert decode_last(encode_last(Last(3, 1.5))) == Last(3, 1.5)


def _batch(seq: int, at: datetime, uuids: list[str]) -> GpuTelemetry:
    gpus = [GpuSample(uuid=u, index=i, model="H100", utilization_gpu_pct=50.0, memory_used_mib=1.0,
                      memory_total_mib=80.0, temperature_c=40.0) for i, u in enumerate(uuids)]
    return GpuTelemetry(cluster="c", node="n1", seq=seq, sample_time=at, gpus=gpus)


def test_admission_refuses_skewed_unknown_and_repeated_batches_and_retries_an_unregistered_node():
    known = {"GPU-a", "GPU-b"}
    ok = _batch(5, T0, ["GPU-a", "GPU-b"])
    assert admit(ok, known, Last(4, T0.timestamp() - 1), T0, 300) is Verdict.NEW
    skewed = admit(ok, known, None, T0.replace(hour=1), 300)
    assert isinstance(skewed, Refused) and skewed.retry_s is None
    assert skewed.reason.startswith("sample_time is 3600s away")
    unregistered = admit(ok, set(), None, T0, 300)
    assert isinstance(unregistered, Refused) and unregistered.retry_s == 1.0
    assert "has not registered" in unregistered.reason
    stranger = admit(_batch(5, T0, ["GPU-x"]), known, None, T0, 300)
    assert isinstance(stranger, Refused) and stranger.reason == "unknown GPU uuid(s) for node c/n1: GPU-x"
    again = admit(ok, known, Last(5, T0.timestamp()), T0, 300)
    assert isinstance(again, Refused) and again.flagged is Verdict.DUPLICATE
    assert again.reason.startswith("duplicate_seq: seq 5")
    assert admit(_batch(1, T0, ["GPU-a"]), known, Last(9, T0.timestamp() - 5), T0, 300) is Verdict.RESTART


def test_gpus_gone_from_a_batch_and_back_are_told_apart():
    assert gone_and_back({"a"}, {"a", "b", "c"}, {"c"}) == ({"b"}, set())
    assert gone_and_back({"a", "c"}, {"a", "b", "c"}, {"b", "c"}) == (set(), {"c"})


def test_a_gang_run_spans_its_parts_gpus_first_start_and_last_end():
    t = T0
    run = apply(JobRun(), JobSubmitted(job_id="g", name="gang", team="nlp", project="llm", command=["x"]))
    placed = dict(job_id="g", attempt=1, cluster="c", gpu_model="H100", gpu_indices=[0], command=["x"],
                  team="nlp", project="llm")
    run = apply(run, JobPlaced(node="n0", gpu_uuids=["GPU-0"], rank=0, **placed))
    run = apply(run, JobPlaced(node="n1", gpu_uuids=["GPU-1"], rank=1, **placed))
    assert (run.node, run.gpu_uuids, run.state) == ("n0", ("GPU-0", "GPU-1"), "placed")
    run = apply(run, JobStarted(job_id="g", attempt=1, cluster="c", node="n1", gpu_uuids=["GPU-1"], pid=1,
                                started_at=t + timedelta(seconds=5), rank=1))
    run = apply(run, JobStarted(job_id="g", attempt=1, cluster="c", node="n0", gpu_uuids=["GPU-0"], pid=1,
                                started_at=t + timedelta(seconds=9), rank=0))
    assert run.started_at == t + timedelta(seconds=5) and run.state == "running"
    end = dict(job_id="g", attempt=1, cluster="c", exit_code=0, started_at=t)
    run = apply(run, JobFinished(node="n1", finished_at=t + timedelta(seconds=60), rank=1, **end))
    run = apply(run, JobFinished(node="n0", finished_at=t + timedelta(seconds=50), rank=0, **end))
    assert run.finished_at == t + timedelta(seconds=60) and run.state == "finished" and run.name == "gang"
    # A new attempt starts over: its GPUs only, no end.
    again = apply(run, JobPlaced(node="n2", gpu_uuids=["GPU-2"], rank=0, **{**placed, "attempt": 2}))
    assert (again.gpu_uuids, again.finished_at, again.state) == (("GPU-2",), None, "placed")
    late = JobFailed(job_id="g", attempt=1, cluster="c", node="n0", reason="lost", failed_at=t + timedelta(hours=1))
    assert apply(again, late) == again  # the older attempt's late end changes nothing


# --------------------------------------------------------------------------- history


def _pts(n, start=0.0, util=50.0, power=100.0, energy0=1000.0):
    return [Point(start + i, util + i, 1000.0 + i, 40.0, power, energy0 + power * i, 1980) for i in range(n)]


def test_minute_rollup_keeps_mean_peak_and_energy_span():
    r = rollup(60.0, _pts(60, start=60.0))
    assert r.n == 60 and r.util_mean == pytest.approx(79.5) and r.util_max == 109.0 - 0  # 50 + 59
    assert r.energy_first == 1000.0 and r.energy_last == 1000.0 + 100 * 59
    assert Rollup.decode(r.encode()) == r
    assert rollup_or_none(0.0, []) is None


def test_each_minute_is_rolled_once_its_offset_has_passed():
    # Batches every second with a 20 s offset: minute [240, 300) is rolled by the first batch at >= 320, once.
    t, rolled = 261.0, []  # minute [180, 240) was rolled at 260
    for t_next in range(262, 500):
        rolled += minutes_to_roll(t, float(t_next), 20.0)
        if t_next == 319:
            assert rolled == []
        if t_next == 320:
            assert rolled == [240.0]
        t = float(t_next)
    assert rolled == [240.0, 300.0, 360.0]  # [420, 480) is due at 500
    assert minutes_to_roll(None, 500.0, 20.0) == []  # nothing stored before: nothing to roll
    # A node silent since 302: its minutes 240 and 300 once the sweep's clock is 380, none after its last point.
    assert minutes_to_roll(302.0, 379.0, 20.0) == [240.0]
    assert minutes_to_roll(302.0, 380.0, 20.0) == [240.0, 300.0]
    assert minutes_to_roll(302.0, 10_000.0, 20.0) == [240.0, 300.0]


def test_roll_offsets_spread_nodes_over_half_a_minute_after_the_grace():
    offsets = [roll_offset(f"onprem/node-{i:04d}", grace_s=5.0) for i in range(1000)]
    assert all(5.0 <= o < 35.0 for o in offsets)
    assert roll_offset("onprem/node-0001", 5.0) == offsets[1]  # stable: the same node, the same offset
    assert max(Counter(int(o) for o in offsets).values()) < 80  # no second takes more than ~2x its share (33)


def test_history_is_raw_within_retention_and_minutes_beyond():
    assert resolution_for(since=9_000, now=10_000, raw_retention_s=3600) == "raw"
    assert resolution_for(since=1_000, now=10_000, raw_retention_s=3600) == "1m"


# --------------------------------------------------------------------------- job usage


def test_job_usage_from_raw_points_sums_energy_over_gpus():
    usage = from_points("j", {"a": _pts(10, util=40), "b": _pts(10, util=60, power=200)}, complete=True)
    assert usage.gpus == 2 and usage.samples == 20
    assert usage.util_mean_pct == pytest.approx(54.5) and usage.util_peak_pct == 69.0
    assert usage.energy_j == pytest.approx(100 * 9 + 200 * 9)
    assert usage.mem_peak_mib == 1009.0


def test_job_usage_from_rollups_weights_minutes_by_samples():
    r1 = rollup(0.0, _pts(60, util=10))
    r2 = rollup(60.0, _pts(30, start=60, util=70, energy0=1000.0 + 100 * 60))
    usage = from_rollups("j", {"a": [r2, r1]}, complete=True)
    assert usage.samples == 90 and usage.resolution == "1m"
    assert usage.util_mean_pct == pytest.approx((r1.util_mean * 60 + r2.util_mean * 30) / 90, abs=0.01)
    assert usage.energy_j == pytest.approx(100 * 89)


def test_job_without_samples_has_no_usage_numbers():
    usage = from_points("short", {"a": []}, complete=True)
    assert usage.samples == 0 and usage.util_mean_pct is None and usage.energy_j is None


# --------------------------------------------------------------------------- DCGM exposition


def _states():
    out = []
    for name, key, n in (("h100-01", "H100", 2), ("r4090-01", "RTX4090", 1)):
        node = SimulatedNode(name, gpu_models()[key], n, interconnect="nvlink" if key == "H100" else "pcie")
        node.job_started([node.identities()[0].uuid], "llama-ft", pid=1)
        ids = {i.uuid: i for i in node.identities()}
        for s in node.sample(T0):
            job = dcgm.JobLabels("llama-ft", "nlp", "llm") if s.index == 0 else None
            out.append(dcgm.GpuState("onprem", name, s, ids[s.uuid], job, last_xid=79 if name == "r4090-01" else 0))
    return out


def _dashboard_queries():
    doc = json.loads((DATA / "grafana-dashboard-12239.json").read_text())
    found = []

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("expr", "query", "definition") and isinstance(v, str) and "DCGM" in v:
                    found.append(v)
                walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    walk(doc)
    return found


def test_exposition_serves_every_metric_and_label_the_grafana_dashboard_queries():
    families = {f.name: f for f in text_string_to_metric_families(dcgm.render(_states()))}
    queries = _dashboard_queries()
    assert len(queries) >= 10
    for q in queries:
        for metric in re.findall(r"DCGM_[A-Z0-9_]+", q):
            assert metric in families, f"{metric} (used by {q!r}) missing"
            samples = families[metric].samples
            assert samples, metric
            for label in re.findall(r"(\w+)\s*=~", q) + re.findall(r"label_values\(\w+,\s*(\w+)\)", q):
                assert all(label in s.labels for s in samples), f"label {label} missing on {metric}"


def test_exposition_uses_dcgm_exporter_types_and_labels():
    expected = {}
    for row in csv.reader(line for line in (DATA / "default-counters.csv").read_text().splitlines()
                          if line.strip() and not line.lstrip().startswith("#")):
        expected[row[0].strip()] = row[1].strip()
    text = dcgm.render(_states())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, fam in families.items():
        if name in expected:
            assert fam.type == expected[name], name
    # Counters keep dcgm-exporter's names: no `_total` suffix.
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    for required in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                     "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                     "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                     "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                     "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        assert required in families, required
    util = {s.labels["UUID"]: s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert len(util) == 3
    for labels in util.values():
        assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "cluster"} <= set(labels)
        assert labels["device"] == f"nvidia{labels['gpu']}"
    held = [lab for lab in util.values() if "hpc_job" in lab]
    assert not any("job" in lab for lab in util.values())  # Prometheus's own label, never ours
    assert len(held) == 2 and all(lab["team"] == "nlp" and lab["project"] == "llm" for lab in held)
    assert {lab["modelName"] for lab in util.values()} == {"NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"}


def test_geforce_cards_before_blackwell_export_no_profiling_metrics():
    states = _states()
    with_tensor = [dcgm.GpuState(st.cluster, st.node, st.sample.model_copy(update={"tensor_active": 0.4,
                                                                                  "pcie_tx_bytes_per_s": 1e9}),
                                 st.identity, st.job) for st in states]
    families = {f.name: f for f in text_string_to_metric_families(dcgm.render(with_tensor))}
    hosts = {s.labels["Hostname"] for s in families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples}
    assert hosts == {"h100-01"}  # the RTX 4090's profiling values are left out
    assert {s.labels["Hostname"] for s in families["DCGM_FI_PROF_PCIE_TX_BYTES"].samples} == {"h100-01"}
    assert {s.labels["Hostname"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples} == {"h100-01", "r4090-01"}
    blackwell = dcgm.GpuState("c", "n", with_tensor[0].sample.model_copy(update={"model": "RTX5090"}))
    assert dcgm.has_profiling(blackwell)


def test_dcgm_exporters_default_video_and_engine_counters_are_exported_where_the_model_has_them():
    families = {f.name: f for f in text_string_to_metric_families(dcgm.render(_states()))}
    hosts = lambda name: {s.labels["Hostname"] for s in families[name].samples}  # noqa: E731
    assert hosts("DCGM_FI_DEV_ENC_UTIL") == hosts("DCGM_FI_DEV_DEC_UTIL") == {"h100-01", "r4090-01"}
    assert hosts("DCGM_FI_PROF_GR_ENGINE_ACTIVE") == hosts("DCGM_FI_PROF_DRAM_ACTIVE") == {"h100-01"}  # no 4090
    engine = {s.labels["gpu"]: s.value for s in families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    assert 0.7 < engine["0"] <= 1.0 and engine["1"] == 0.0  # the busy GPU and the idle one
    dram = {s.labels["gpu"]: s.value for s in families["DCGM_FI_PROF_DRAM_ACTIVE"].samples}
    assert 0.2 < dram["0"] < engine["0"] and dram["1"] == 0.0


def test_the_simulator_decodes_video_for_some_jobs_and_encodes_only_where_there_is_an_encoder():
    jobs = [f"job-{i}" for i in range(40)]
    for key, has_encoder in (("H100", False), ("RTX4090", True)):
        node = SimulatedNode("n", gpu_models()[key], len(jobs), seed=3)
        for ident, job in zip(node.identities(), jobs, strict=True):
            node.job_started([ident.uuid], job, pid=1, util_pct=90)
        samples = node.sample(T0)
        decoding = [s for s in samples if s.decoder_util_pct]
        assert 0 < len(decoding) < len(samples) / 2  # a minority of jobs read video
        assert all(5 < (s.decoder_util_pct or 0) <= 50 for s in decoding)
        assert all(bool(s.encoder_util_pct) == (has_encoder and bool(s.decoder_util_pct)) for s in samples)


def test_unsupported_metrics_are_left_out_not_zero():
    text = dcgm.render(_states())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    rtx_hosts = lambda name: {s.labels["Hostname"] for s in families[name].samples}  # noqa: E731
    assert rtx_hosts("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == {"h100-01"}
    assert rtx_hosts("DCGM_FI_DEV_MEMORY_TEMP") == {"h100-01"}
    assert rtx_hosts("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == {"h100-01"}
    xid = {s.labels["Hostname"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert xid == {"h100-01": 0.0, "r4090-01": 79.0}
    energy = [s for s in families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].samples]
    assert all(s.value > 0 for s in energy)  # mJ


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_exposition_passes_promtool_check_metrics():
    text = dcgm.render(_states())
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    # promtool 2.42 cannot turn linting off: dcgm-exporter's own names (counters without
    # _total, camelCase labels) draw naming warnings by design. Anything else is a failure.
    allowed = re.compile(
        r'counter metrics should have "_total" suffix|should be written in .snake_case.|should not include type')
    assert done.returncode in (0, 3), done.stdout + done.stderr
    problems = [line for line in (done.stdout + done.stderr).splitlines() if line.strip() and not allowed.search(line)]
    assert problems == []


def test_the_simulated_idle_gpu_shows_idle_clocks_and_about_1_mib_used():
    from datetime import UTC, datetime

    from whaleflux.agent.simulated import SimulatedNode
    from whaleflux.shared.catalog import gpu_models

    node = SimulatedNode("a100-01", gpu_models()["A100"], 2, seed=1)
    t = datetime(2026, 12, 1, tzinfo=UTC)
    idle, _ = node.sample(t)
    assert idle.sm_clock_mhz == 210 and idle.memory_used_mib == 1.0 and idle.processes == []
    node.job_started([node.identities()[0].uuid], "j1", pid=42, util_pct=90)
    busy, _ = node.sample(t)
    assert busy.sm_clock_mhz == 1410 and busy.memory_used_mib > 512 and busy.processes[0].job_id == "j1"
