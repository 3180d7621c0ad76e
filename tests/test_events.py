"""Event contracts: envelope, validation with reasons, committed JSON Schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from whaleflux.shared import schemas, subjects
from whaleflux.shared.events import (
    REGISTRY,
    GpuSample,
    GpuTelemetry,
    InvalidEvent,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    decode,
    encode,
    make_envelope,
)

ROOT = Path(__file__).resolve().parents[1]


def test_event_round_trips_through_a_cloudevents_envelope():
    data = JobSubmitted(job_id="j1", name="train", command=["python", "train.py"], gpus=2)
    env = make_envelope(data, source="test", subject="j1", correlation_id="j1", time=datetime(2026, 1, 1, tzinfo=UTC))
    doc = json.loads(encode(env))
    assert doc["specversion"] == "1.0" and doc["type"] == "io.whaleflux.job.submitted.v1"
    assert {"id", "source", "type", "time", "subject", "datacontenttype", "data"} <= set(doc)
    env2, data2 = decode(encode(env))
    assert data2 == data and env2.id == env.id and env2.correlationid == "j1"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{not json", "not JSON"),
        (b'{"id": "x"}', "envelope: specversion: Field required"),
        (json.dumps({"specversion": "1.0", "id": "1", "source": "s", "type": "io.whaleflux.job.submitted.v9",
                     "time": "2026-01-01T00:00:00Z", "data": {}}).encode(), "unknown event type or version"),
        (json.dumps({"specversion": "1.0", "id": "1", "source": "s", "type": "io.whaleflux.job.submitted.v1",
                     "time": "2026-01-01T00:00:00Z",
                     "data": {"job_id": "j", "name": "n", "command": [], "gpus": 0}}).encode(),
         "command"),
    ],
)
def test_invalid_events_are_refused_with_a_reason_naming_the_problem(raw, reason):
    with pytest.raises(InvalidEvent) as err:
        decode(raw)
    assert reason in err.value.reason


def test_reasons_never_echo_the_offending_value():
    env = make_envelope(JobSubmitted(job_id="j", name="n", command=["x"]), source="t",
                        time=datetime(2026, 1, 1, tzinfo=UTC))
    doc = json.loads(encode(env))
    doc["data"]["gpus"] = "s3cr3t-value"
    with pytest.raises(InvalidEvent) as err:
        decode(json.dumps(doc).encode())
    assert "gpus" in err.value.reason and "s3cr3t-value" not in err.value.reason


def test_every_required_event_has_a_versioned_model():
    names = {t.removeprefix("io.whaleflux.").rsplit(".v", 1)[0] for t in REGISTRY}
    assert names >= {
        "gpu.telemetry", "node.registered", "node.heartbeat", "job.submitted", "job.placed", "job.started",
        "job.finished", "job.failed", "lease.expiring", "alert.raised", "alert.resolved",
    }


def test_committed_event_schemas_are_up_to_date():
    stale = schemas.stale(ROOT / "docs" / "events")
    assert not stale, f"run `whaleflux schemas` to refresh: {stale}"


def test_subject_tokens_cannot_inject_wildcards():
    assert subjects.gpu_telemetry("onprem", "h100-01") == "gpu.telemetry.onprem.h100-01"
    for bad in ("a.b", "*", ">", "a b", ""):
        with pytest.raises(ValueError):
            subjects.gpu_telemetry("onprem", bad)


def test_a_node_subject_names_its_node_and_the_data_must_name_the_same():
    assert subjects.job_finished("onprem", "h100-01") == "job.finished.onprem.h100-01"
    assert subjects.subject_node("gpu.telemetry.onprem.h100-01.3") == ("onprem", "h100-01")  # stored, partitioned
    assert subjects.subject_node(subjects.JOB_FINISHED) is None  # bare: history from before
    assert subjects.subject_node("job.submitted.x.y") is None and subjects.subject_node("alert.raised") is None
    assert subjects.node_mismatch("job.started.onprem.h100-01", "onprem", "h100-01") is None
    assert subjects.node_mismatch("job.started.onprem.h100-01", "onprem", "a100-01") == (
        "subject names node onprem/h100-01 but data names onprem/a100-01")
    assert subjects.node_mismatch("node.heartbeat.onprem.h100-01", None, None) is not None  # data names no node


def test_envelope_time_is_timezone_aware():
    env = make_envelope(JobSubmitted(job_id="j", name="n", command=["x"]), source="t")
    assert env.time.tzinfo is not None and env.time <= datetime.now(UTC)


def _telemetry_doc() -> dict:
    sample = GpuSample(uuid="GPU-1", index=0, model="A100", utilization_gpu_pct=5, memory_used_mib=10,
                       memory_total_mib=81920, temperature_c=31)
    data = GpuTelemetry(cluster="c", node="n", seq=1, sample_time=datetime(2026, 1, 1, tzinfo=UTC), gpus=[sample])
    return json.loads(encode(make_envelope(data, source="t", time=datetime(2026, 1, 1, tzinfo=UTC))))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_refused_in_every_number(literal):
    raw = json.dumps(_telemetry_doc()).replace('"memory_total_mib": 81920.0', f'"memory_total_mib": {literal}')
    assert literal in raw
    with pytest.raises(InvalidEvent) as err:
        decode(raw.encode())
    assert "gpus.0.memory_total_mib" in err.value.reason and "finite number" in err.value.reason


@pytest.mark.parametrize("field, value", [("seq", 2**70), ("seq", -1)])
def test_integers_are_bounded(field, value):
    doc = _telemetry_doc()
    doc["data"][field] = value
    with pytest.raises(InvalidEvent) as err:
        decode(json.dumps(doc).encode())
    assert err.value.reason.startswith(f"io.whaleflux.gpu.telemetry.v1: {field}:")


def test_attempts_ranks_and_pids_cannot_be_2_to_the_70():
    for model, field in ((JobPlaced, "attempt"), (JobPlaced, "rank"), (JobStarted, "pid")):
        with pytest.raises(ValidationError) as err:
            model.model_validate({field: 2**70})
        assert any(e["loc"] == (field,) and e["type"] == "less_than_equal" for e in err.value.errors())


def test_text_that_reaches_a_process_holds_no_nul_byte():
    with pytest.raises(ValidationError) as err:
        JobSubmitted(job_id="j", name="n", command=["sh", "-c", "a\x00b"], env={"A": "1"}, workdir="/tmp/\x00")
    assert {e["loc"] for e in err.value.errors()} == {("command", 2), ("workdir",)}


def test_cloudevents_optional_and_extension_attributes_are_accepted_and_travel_on():
    doc = _telemetry_doc()
    doc.update(dataschema="https://whaleflux.example/schemas/gpu.telemetry.v1.json",
               datacontenttype="application/json; charset=utf-8",
               traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", sampled=True, hops=3)
    env, data = decode(json.dumps(doc).encode())
    assert env.dataschema == doc["dataschema"] and env.datacontenttype == "application/json; charset=utf-8"
    assert env.model_extra == {"traceparent": doc["traceparent"], "sampled": True, "hops": 3}
    assert isinstance(data, GpuTelemetry)
    again = json.loads(encode(env))
    assert again["traceparent"] == doc["traceparent"] and again["hops"] == 3


@pytest.mark.parametrize(
    "attributes, reason",
    [
        ({"datacontenttype": "application/xml"}, "datacontenttype: must be application/json"),
        ({"data_base64": "AAEC"}, "data_base64: binary data is not accepted"),
        ({"Trace_Parent": "x"}, "an extension attribute name is 1-20 lowercase letters or digits"),
        ({"spans": ["a"]}, "spans: an extension attribute is a string, a 32-bit integer or a boolean"),
        ({"big": 2**40}, "big: an extension attribute is a string, a 32-bit integer or a boolean"),
        ({"subject": ""}, "subject: String should have at least 1 character"),
        ({"specversion": "0.3"}, "specversion"),
    ],
)
def test_the_envelope_is_checked_per_the_cloudevents_spec(attributes, reason):
    doc = {**_telemetry_doc(), **attributes}
    with pytest.raises(InvalidEvent) as err:
        decode(json.dumps(doc).encode())
    assert err.value.reason.startswith("envelope: ") and reason in err.value.reason


def test_json_nested_too_deeply_is_an_invalid_event_not_a_crash():
    with pytest.raises(InvalidEvent) as err:
        decode(b"[" * 100_000)
    assert err.value.reason == "not JSON: nested too deeply"
