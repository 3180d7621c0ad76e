"""Thermal rule and the Alertmanager-compatible webhook payload."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from whaleflux.alerting.notify import alertmanager_payload
from whaleflux.alerting.rules import thermal
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import AlertRaised, GpuSample

# A payload a real Alertmanager 0.25 sent (tests/data/README.md): a missing file fails the test, never skips the check.
SAMPLE = Path(__file__).parent / "data" / "alertmanager" / "alertmanager-0.25-webhook-firing.json"


def gpu(temp, slowdown=None, model="H100"):
    return GpuSample(uuid="GPU-1", index=0, model=model, utilization_gpu_pct=90, memory_used_mib=1,
                     memory_total_mib=81559, temperature_c=temp, slowdown_temperature_c=slowdown)


def test_fires_at_the_models_slowdown_temperature_from_gpu_models_yaml():
    h100 = gpu_models()["H100"]
    assert thermal.evaluate(gpu(88.9), h100).firing is False
    assert thermal.evaluate(gpu(89.0), h100).firing is True


def test_device_reported_threshold_wins_over_the_catalogue():
    verdict = thermal.evaluate(gpu(85, slowdown=84), gpu_models()["H100"])
    assert verdict.firing and verdict.threshold_c == 84


def test_resolves_only_below_the_hysteresis_band():
    h100 = gpu_models()["H100"]
    assert thermal.evaluate(gpu(87), h100).resolved is False
    assert thermal.evaluate(gpu(85.9), h100).resolved is True


def test_fingerprint_is_stable_and_label_order_free():
    assert thermal.fingerprint({"a": "1", "b": "2"}) == thermal.fingerprint({"b": "2", "a": "1"})
    assert thermal.fingerprint({"a": "1"}) != thermal.fingerprint({"a": "2"})


def test_webhook_payload_has_the_shape_alertmanager_receivers_expect():
    alert = AlertRaised(fingerprint="f", rule="GPUTemperatureHigh", severity="critical", category="thermal",
                        summary="hot", labels={"UUID": "GPU-1", "Hostname": "n", "gpu": "0"},
                        starts_at=datetime(2026, 12, 1, tzinfo=timezone.utc))
    ours = alertmanager_payload(alert, "http://wf")
    reference = json.loads(SAMPLE.read_text())
    assert set(ours) == set(reference)
    assert set(ours["alerts"][0]) == set(reference["alerts"][0])
    assert ours["status"] == "firing" and ours["version"] == "4"
    assert ours["alerts"][0]["labels"]["alertname"] == "GPUTemperatureHigh"
    assert ours["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
