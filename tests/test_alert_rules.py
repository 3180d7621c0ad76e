"""The shipped thermal rule (GPUTemperatureHigh, a threshold rule) and the webhook payload of one firing alert."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config
from whaleflux.alerting.dispatch.groups import Notification, NotifiedAlert
from whaleflux.alerting.receivers import webhook
from whaleflux.alerting.rules.engine import RuleEngine
from whaleflux.alerting.rules.series import fingerprint
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuSample, GpuTelemetry

# A payload a real Alertmanager 0.25 sent (tests/data/README.md): a missing file fails the test, never skips the check.
SAMPLE = Path(__file__).parent / "data" / "alertmanager" / "alertmanager-0.25-webhook-firing.json"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def gpu(temp, slowdown=None, model="H100"):
    return GpuSample(uuid="GPU-1", index=0, model=model, utilization_gpu_pct=90, memory_used_mib=1,
                     memory_total_mib=81559, temperature_c=temp, slowdown_temperature_c=slowdown)


class Thermal:
    """The shipped rules file with only its thermal rule, fed one sample a second."""

    def __init__(self) -> None:
        config = load_config(DEFAULT_RULES_FILE)
        rules = [r for r in config.rules if r.name == "GPUTemperatureHigh"]
        self.engine = RuleEngine(config.model_copy(update={"rules": rules}), gpu_models())
        self.t = 0

    def feed(self, sample: GpuSample) -> list[tuple[bool, float | None, str]]:
        self.t += 1
        batch = GpuTelemetry(cluster="c", node="n", seq=self.t, sample_time=T0 + timedelta(seconds=self.t),
                             gpus=[sample])
        return [(tr.firing, tr.value, tr.summary) for tr in self.engine.observe_telemetry(batch, batch.sample_time)]


def test_fires_at_the_models_slowdown_temperature_from_gpu_models_yaml():
    assert gpu_models()["H100"].temp_slowdown_c == 89
    rule = Thermal()
    assert rule.feed(gpu(88.9)) == []
    [(firing, value, summary)] = rule.feed(gpu(89.0))
    assert firing and value == 89.0 and "slowdown 89 C" in summary


def test_device_reported_threshold_wins_over_the_catalogue():
    rule = Thermal()
    [(firing, _, summary)] = rule.feed(gpu(85, slowdown=84))
    assert firing and "slowdown 84 C" in summary


def test_resolves_only_below_the_hysteresis_band():
    rule = Thermal()
    assert rule.feed(gpu(95))[0][0] is True
    assert rule.feed(gpu(87)) == []  # under the limit (89) but within 3 C of it: still firing
    [(firing, value, _)] = rule.feed(gpu(85.9))
    assert not firing and value == 85.9


def test_fingerprint_is_stable_and_label_order_free():
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"})
    assert fingerprint({"a": "1"}) != fingerprint({"a": "2"})


def test_webhook_payload_of_one_alert_has_the_shape_alertmanager_receivers_expect():
    alert = NotifiedAlert(status="firing", fingerprint="f", starts_at=T0, annotations={"summary": "hot"},
                          labels={"alertname": "GPUTemperatureHigh", "severity": "critical", "UUID": "GPU-1",
                                  "Hostname": "n", "gpu": "0"})
    n = Notification(id="g-1", receiver="webhook", group_key="g", group_labels={"incident": "inc-1"},
                     status="firing", alerts=[alert], created_at=T0)
    ours = webhook.build(n, receiver="webhook", external_url="http://wf")
    reference = json.loads(SAMPLE.read_text())
    assert set(ours) == set(reference)
    assert set(ours["alerts"][0]) == set(reference["alerts"][0])
    assert ours["status"] == "firing" and ours["version"] == "4"
    assert ours["alerts"][0]["labels"]["alertname"] == "GPUTemperatureHigh"
    assert ours["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
