"""Event contracts: envelope, validation with reasons, committed JSON Schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from whaleflux.shared import schemas, subjects
from whaleflux.shared.events import (
    REGISTRY,
    InvalidEvent,
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


def test_envelope_time_is_timezone_aware():
    env = make_envelope(JobSubmitted(job_id="j", name="n", command=["x"]), source="t")
    assert env.time.tzinfo is not None and env.time <= datetime.now(UTC)
