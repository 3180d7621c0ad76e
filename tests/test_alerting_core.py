"""The pure core of alerting: rules file, rule kinds, routes, groups, silences, inhibition, incidents, payloads."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from whaleflux.alerting.config import DEFAULT_RULES_FILE, ConfigError, XidRule, load_config, parse_config
from whaleflux.alerting.delivery.stages import TokenBucket, backoff_s
from whaleflux.alerting.dispatch.groups import Dispatcher, GroupedAlert
from whaleflux.alerting.dispatch.incidents import Correlator
from whaleflux.alerting.dispatch.inhibit import InhibitRule
from whaleflux.alerting.dispatch.intake import Intake
from whaleflux.alerting.dispatch.matchers import Matcher
from whaleflux.alerting.dispatch.route import build_route
from whaleflux.alerting.dispatch.silences import Silence
from whaleflux.alerting.receivers import pagerduty, slack, teams, webhook
from whaleflux.alerting.rules.engine import NodeInfo, RuleEngine
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import AlertRaised, GpuSample, GpuTelemetry, JobFailed

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
# Payloads a real Alertmanager 0.25 sent (tests/data/README.md): a missing file fails the test, never skips the check.
SAMPLES = Path(__file__).parent / "data" / "alertmanager"


def sample(**kw) -> GpuSample:
    base = dict(uuid="GPU-1", index=0, model="H100", utilization_gpu_pct=90, memory_used_mib=1000,
                memory_total_mib=81559, temperature_c=60)
    return GpuSample(**{**base, **kw})


def batch(t: float, *gpus: GpuSample, node="h100-01") -> GpuTelemetry:
    return GpuTelemetry(cluster="onprem", node=node, seq=int(t), sample_time=T0 + timedelta(seconds=t), gpus=list(gpus))


def engine(rules_yaml: str) -> RuleEngine:
    routes = "\nroute: {receiver: r}\nreceivers: [{name: r, type: webhook, url: 'http://x'}]\n"
    return RuleEngine(parse_config(rules_yaml + routes), gpu_models())


def fired(transitions) -> list[str]:
    return [t.rule.name for t in transitions if t.firing]


# --------------------------------------------------------------------------- rules file


def test_bad_rules_file_names_file_line_and_key():
    text = ("rules:\n  - name: Hot\n    kind: threshold\n    metric: temprature_c\n    threshold: {value: 80}\n"
            "    summary: s\n")
    with pytest.raises(ConfigError) as exc:
        parse_config(text + "route: {receiver: nobody}\n", "site.yaml")
    assert "site.yaml:4: rules[0].metric: unknown metric 'temprature_c'" in exc.value.errors
    assert "site.yaml:7: route.receiver: no receiver named 'nobody'" in exc.value.errors


def test_missing_field_and_bad_duration_point_at_their_lines():
    text = "rules:\n  - name: Up\n    kind: rate\n    metric: temperature_c\n    for: soon\n    summary: s\n"
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "r.yaml")
    errors = exc.value.errors
    assert any(e.startswith("r.yaml:2: rules[0].per_minute: Field required") for e in errors), errors
    assert any(e.startswith("r.yaml:5: rules[0].for: expected a duration") for e in exc.value.errors), exc.value.errors


def test_rules_file_errors_come_from_the_shared_loader_in_the_same_format(tmp_path):
    from whaleflux.shared.yamlconfig import ConfigFileError

    assert issubclass(ConfigError, ConfigFileError)
    with pytest.raises(ConfigError) as exc:
        parse_config("- just a list\n", "x.yaml")
    assert exc.value.errors == ["x.yaml:1: (document): expected a mapping with rules, route, receivers"]
    with pytest.raises(ConfigError) as exc:
        parse_config("rules:\n  - name: [unclosed\n", "x.yaml")
    assert exc.value.errors[0].startswith("x.yaml:3: (yaml): ")
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path / "gone.yaml")
    assert exc.value.errors == [f"{tmp_path / 'gone.yaml'}:1: (file): cannot read: No such file or directory"]
    # A wrong kind points at the `kind:` line; a field of a known kind at its own line, without the union tag.
    text = ("rules:\n  - name: A\n    summary: s\n    kind: thresold\n"
            "  - name: B\n    kind: xid\n    summary: s\n    codes: []\n")
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "x.yaml")
    assert exc.value.errors[0].startswith(
        "x.yaml:4: rules[0].kind: Input tag 'thresold' found using 'kind' does not match")
    assert exc.value.errors[1].startswith("x.yaml:8: rules[1].codes: List should have at least 1 item")


def test_the_shipped_default_rules_file_loads():
    config = load_config(DEFAULT_RULES_FILE)
    hot, xid = config.rule("GPUTemperatureHigh"), config.rule("GPUXidDrain")
    assert hot is not None and hot.actions == ["drain"]
    assert isinstance(xid, XidRule) and {48, 79} <= set(xid.codes)


# --------------------------------------------------------------------------- rule kinds

THERMAL = """rules:
  - name: Hot
    kind: threshold
    metric: temperature_c
    threshold: {device: slowdown_temperature_c, per_model: {A100: 80}, model: temp_slowdown_c}
    hysteresis: 3
    severity: critical
    summary: "{value:.0f} of {threshold:.0f}"
"""


def test_threshold_prefers_device_then_per_model_then_catalogue_with_hysteresis():
    e = engine(THERMAL)
    # H100 slowdown 89 in the catalogue
    assert fired(e.observe_telemetry(batch(0, sample(temperature_c=88.9)), T0)) == []
    [tr] = e.observe_telemetry(batch(1, sample(temperature_c=89)), T0)
    assert tr.firing and tr.summary == "89 of 89"
    assert e.observe_telemetry(batch(2, sample(temperature_c=87)), T0) == []  # inside the band: still firing
    [tr] = e.observe_telemetry(batch(3, sample(temperature_c=85.9)), T0)
    assert not tr.firing
    device_limit = sample(uuid="G2", temperature_c=85, slowdown_temperature_c=84)
    assert fired(e.observe_telemetry(batch(4, device_limit), T0)) == ["Hot"]
    assert fired(e.observe_telemetry(batch(5, sample(uuid="G3", model="A100", temperature_c=81)), T0)) == ["Hot"]


def test_for_duration_waits_before_firing_and_resets_when_condition_breaks():
    e = engine(THERMAL.replace("hysteresis: 3", "hysteresis: 3\n    for: 10s"))
    assert fired(e.observe_telemetry(batch(0, sample(temperature_c=95)), T0)) == []
    assert fired(e.observe_telemetry(batch(5, sample(temperature_c=60)), T0)) == []
    assert fired(e.observe_telemetry(batch(6, sample(temperature_c=95)), T0)) == []
    assert fired(e.observe_telemetry(batch(15, sample(temperature_c=95)), T0)) == []
    assert fired(e.observe_telemetry(batch(16, sample(temperature_c=95)), T0)) == ["Hot"]


def test_rate_of_change_fires_on_a_fast_rise_only():
    e = engine('rules:\n  - {name: Rising, kind: rate, metric: temperature_c, per_minute: 10, window: 30s,'
               ' min_samples: 5, summary: "{per_minute:.0f}"}\n')
    out = []
    for t in range(30):
        out += e.observe_telemetry(batch(t, sample(temperature_c=50 + 0.05 * t)), T0)  # 3 C/min: fine
    assert fired(out) == []
    for t in range(30, 60):
        out += e.observe_telemetry(batch(t, sample(temperature_c=52 + 0.5 * (t - 30))), T0)  # 30 C/min
    assert fired(out) == ["Rising"]


def test_memory_trend_fires_when_projected_to_fill_within_the_horizon():
    e = engine("rules:\n  - {name: Leak, kind: trend, window: 60s, within: 10m, min_samples: 10,"
               " summary: '{eta_min:.1f}'}\n")
    out = []
    for t in range(60):  # flat
        out += e.observe_telemetry(batch(t, sample(memory_used_mib=40000 + (t % 3) * 10)), T0)
    assert fired(out) == []
    for t in range(60, 120):  # +100 MiB/s: ~41,000 MiB left -> ~7 min
        out += e.observe_telemetry(batch(t, sample(memory_used_mib=40000 + 100 * (t - 60))), T0)
    [tr] = [t for t in out if t.firing]
    assert 5 < float(tr.summary) < 10


def test_counters_xids_throttle_and_flags():
    e = engine("""rules:
  - {name: ECC, kind: counter, metric: ecc_uncorrected, increase: 1, window: 10m, clear_after: 60s, summary: s}
  - {name: Xid, kind: xid, codes: [79, 48], clear_after: 60s, summary: "XID {codes}"}
  - {name: Brake, kind: throttle, reasons: [hw_power_brake_slowdown], summary: s}
  - {name: RemapFail, kind: flag, metric: row_remap_failure, summary: s}
""")
    old_errors = sample(ecc_uncorrected=3, row_remap_failure=False)
    assert fired(e.observe_telemetry(batch(0, old_errors), T0)) == []  # old errors: no page
    out = e.observe_telemetry(batch(1, sample(ecc_uncorrected=4, xid_errors=[13, 79], row_remap_failure=True,
                                              throttle_reasons=["hw_power_brake_slowdown"])), T0)
    assert sorted(fired(out)) == ["Brake", "ECC", "RemapFail", "Xid"]
    assert [t.summary for t in out if t.rule.name == "Xid"] == ["XID 79"]
    out = e.observe_telemetry(batch(30, sample(ecc_uncorrected=4, row_remap_failure=False)), T0)
    # XID and ECC hold for clear_after
    assert sorted(t.rule.name for t in out if not t.firing) == ["Brake", "RemapFail"]
    out = e.observe_telemetry(batch(62, sample(ecc_uncorrected=4)), T0)
    assert sorted(t.rule.name for t in out if not t.firing) == ["ECC", "Xid"]


def test_baseline_learns_a_card_that_runs_hot_and_stays_quiet_during_warm_up():
    e = engine("rules:\n  - {name: Odd, kind: baseline, metric: temperature_c, half_life: 5m, warm_up: 60, sigmas: 4,"
               " min_delta: 5, summary: s}\n")
    out = []
    for t in range(50):
        out += e.observe_telemetry(batch(t, sample(temperature_c=80 + (t % 2))), T0)
    out += e.observe_telemetry(batch(50, sample(temperature_c=95)), T0)  # still warming up
    assert fired(out) == []
    for t in range(51, 200):
        out += e.observe_telemetry(batch(t, sample(temperature_c=80 + (t % 2))), T0)  # always 80-81: its normal
    assert fired(out) == []
    assert fired(e.observe_telemetry(batch(200, sample(temperature_c=92)), T0)) == ["Odd"]


def test_gpu_alerts_carry_dcgm_exporter_label_values_from_the_registration_and_keep_their_fingerprint():
    e = engine("rules:\n  - {name: Hot, kind: threshold, metric: temperature_c, threshold: {value: 85}, summary: s}\n")
    [before] = e.observe_telemetry(batch(0, sample(temperature_c=90)), T0)
    assert before.labels["modelName"] == "H100" and before.labels["instance"] == "h100-01"  # not registered yet
    e.observe_telemetry(batch(1, sample(temperature_c=60)), T0)
    e.observe_node("onprem", "h100-01", NodeInfo(rack="r1", gpus=(("GPU-1", "NVIDIA H100 80GB HBM3",
                                                                     "00000000:1F:00.0"),)), T0)
    [after] = e.observe_telemetry(batch(2, sample(temperature_c=90)), T0)
    assert (after.labels["modelName"], after.labels["pci_bus_id"], after.labels["instance"]) == (
        "NVIDIA H100 80GB HBM3", "00000000:1F:00.0", "h100-01")
    assert after.fingerprint == before.fingerprint  # learning the name changes no alert's identity
    assert NodeInfo.from_json(json.loads(json.dumps(e.nodes[("onprem", "h100-01")].to_json()))) == e.nodes[
        ("onprem", "h100-01")]


def test_a_thermal_alert_does_not_resolve_because_its_drain_idled_the_gpu():
    e = engine("rules:\n  - {name: Hot, kind: threshold, metric: temperature_c, threshold: {value: 88}, hysteresis: 3,"
               " resolve_under_load: 50, resolve_hold: 30m, summary: s}\n")
    [fire] = e.observe_telemetry(batch(0, sample(temperature_c=91)), T0)
    assert fire.firing
    # Drained: idle, and it cools below the limit: still firing (the cooling fault is not gone) ...
    out = []
    for t in range(1, 600):
        out += e.observe_telemetry(batch(t, sample(temperature_c=60, utilization_gpu_pct=0)), T0)
    assert out == []
    # ... until it stayed cool for the hold time,
    [done] = e.observe_telemetry(batch(1801, sample(temperature_c=60, utilization_gpu_pct=0)), T0)
    assert not done.firing
    # or it is cool under load (the fault is fixed and the GPU back at work).
    e.observe_telemetry(batch(1900, sample(temperature_c=91)), T0)
    [back] = e.observe_telemetry(batch(1901, sample(temperature_c=70, utilization_gpu_pct=95)), T0)
    assert not back.firing
    # Hot again after a while cool and idle: the hold counts afresh.
    e.observe_telemetry(batch(2000, sample(temperature_c=91)), T0)
    e.observe_telemetry(batch(2001, sample(temperature_c=60, utilization_gpu_pct=0)), T0)
    e.observe_telemetry(batch(2100, sample(temperature_c=91)), T0)
    assert e.observe_telemetry(batch(3850, sample(temperature_c=60, utilization_gpu_pct=0)), T0) == []


def test_a_baseline_of_steady_idle_gpus_counts_sigmas_against_its_minimum_spread():
    e = engine("rules:\n  - {name: Odd, kind: baseline, metric: temperature_c, warm_up: 50, sigmas: 5, min_delta: 10,"
               " min_spread: 2, summary: '{delta:.0f} C above {mean:.0f} C ({sigmas:.1f} sigma)'}\n")
    for t in range(100):  # an idle GPU holds 34.0-34.1 C
        e.observe_telemetry(batch(t, sample(temperature_c=34 + (t % 2) / 10, utilization_gpu_pct=0)), T0)
    [tr] = e.observe_telemetry(batch(100, sample(temperature_c=70, utilization_gpu_pct=0)), T0)
    assert tr.summary == "36 C above 34 C (18.0 sigma)"


def test_missing_heartbeat_fires_and_resolves():
    e = engine("rules:\n  - {name: NodeDown, kind: heartbeat, for: 30s, summary: '{node} silent {silent_s:.0f}s'}\n")
    e.observe_node("onprem", "n1", NodeInfo(rack="r1", pool="p"), T0)
    assert e.tick(T0 + timedelta(seconds=29)) == []
    [tr] = e.tick(T0 + timedelta(seconds=31))
    assert tr.firing and tr.labels["rack"] == "r1" and tr.summary == "n1 silent 31s"
    e.observe_node("onprem", "n1", None, T0 + timedelta(seconds=40))
    [tr] = e.tick(T0 + timedelta(seconds=41))
    assert not tr.firing


def test_event_rule_raises_once_per_key_and_ages_out():
    e = engine("rules:\n  - {name: JobFailed, kind: event, event: job.failed, key: [job_id], resolve_after: 1h,"
               " summary: '{job_id}: {reason}'}\n")
    ev = JobFailed(job_id="j1", attempt=1, cluster="c", node="n", reason="oom", failed_at=T0)
    [tr] = e.observe_event("job.failed", ev, T0)
    assert tr.firing and tr.summary == "j1: oom" and tr.labels == {"job_id": "j1"}
    assert e.observe_event("job.failed", ev, T0) == []
    [tr] = e.tick(T0 + timedelta(hours=1, seconds=1))
    assert not tr.firing


# --------------------------------------------------------------------------- routes, groups, silences, inhibition


def config(text: str):
    return parse_config(text)


ROUTES = """
route:
  receiver: default
  group_by: [incident]
  group_wait: 0s
  group_interval: 10s
  repeat_interval: 1h
  routes:
    - {matchers: [severity="critical"], receiver: pager, continue: true}
    - {matchers: ['team=~"ml|nlp"'], receiver: ml}
    - {matchers: [category=cost], receiver: finops, group_wait: 30s}
receivers:
  - {name: default, type: webhook, url: "http://d"}
  - {name: pager, type: pagerduty, routing_key_env: PD_KEY}
  - {name: ml, type: slack, url: "http://s"}
  - {name: finops, type: teams, url: "http://t"}
"""


def test_route_tree_matches_with_continue_and_falls_back_to_the_root():
    route = build_route(config(ROUTES).route)
    assert [r.receiver for r in route.match({"severity": "critical", "team": "nlp"})] == ["pager", "ml"]
    assert [r.receiver for r in route.match({"severity": "critical", "category": "cost"})] == ["pager", "finops"]
    assert [r.receiver for r in route.match({"severity": "warning"})] == ["default"]
    finops = route.match({"category": "cost"})[0]
    assert finops.group_wait_s == 30 and finops.group_interval_s == 10  # inherited


def alert(fp, t=0.0, **labels) -> GroupedAlert:
    return GroupedAlert(fingerprint=fp, labels={"alertname": "Hot", "severity": "warning", "incident": "i1", **labels},
                        annotations={"summary": fp}, starts_at=T0 + timedelta(seconds=t))


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_group_wait_interval_and_repeat_timing():
    cfg = config(ROUTES.replace("group_wait: 0s", "group_wait: 2s"))
    d = Dispatcher(build_route(cfg.route), [])
    d.add(alert("a"), at(0))
    assert d.flush(at(1), [])[0] == []
    [n] = d.flush(at(2), [])[0]
    assert n.status == "firing" and [a.fingerprint for a in n.alerts] == ["a"]
    d.add(alert("b"), at(3))
    assert d.flush(at(5), [])[0] == []  # group_interval not over
    [n] = d.flush(at(12), [])[0]
    assert sorted(a.fingerprint for a in n.alerts) == ["a", "b"]
    assert d.flush(at(30), [])[0] == []  # nothing changed, repeat not due
    [n] = d.flush(at(12 + 3600), [])[0]
    assert n.repeat
    d.add(alert("a").model_copy(update={"ends_at": at(3700)}), at(3700))
    d.add(alert("b").model_copy(update={"ends_at": at(3700)}), at(3700))
    [n] = d.flush(at(3700 + 10), [])[0]
    assert n.status == "resolved" and {a.status for a in n.alerts} == {"resolved"}
    assert d.groups == {}


def test_acknowledged_groups_stop_repeating_and_pagerduty_gets_acknowledge():
    d = Dispatcher(build_route(config(ROUTES).route), [])
    d.add(alert("a", severity="critical"), at(0))
    notes = d.flush(at(0), [])[0]
    assert [n.receiver for n in notes] == ["pager"]  # a matching child takes it from the root, as in Alertmanager
    d.acknowledge("a")
    notes = d.flush(at(10), [])[0]
    assert {n.status for n in notes} == {"acknowledged"}
    assert d.flush(at(10 + 7200), [])[0] == []


def test_silences_and_inhibition_mute_alerts():
    d = Dispatcher(build_route(config(ROUTES).route),
                   [InhibitRule([Matcher.parse('alertname="NodeDown"')], [Matcher.parse('alertname!="NodeDown"')],
                                ("Hostname",))])
    silence = Silence(id="s1", matchers=['Hostname="n2"'], starts_at=at(0), ends_at=at(600), created_by="ops",
                      comment="maintenance")
    d.add(alert("down", alertname="NodeDown", Hostname="n1", incident="i9"), at(0))
    d.add(alert("gpu", Hostname="n1"), at(0))
    d.add(alert("quiet", Hostname="n2", incident="i2"), at(0))
    notes = d.flush(at(0), [silence])[0]
    sent = {a.fingerprint for n in notes for a in n.alerts}
    assert sent == {"down"}
    notes = d.flush(at(700), [silence])[0]  # silence over
    assert {a.fingerprint for n in notes for a in n.alerts} == {"quiet"}


def test_same_rule_on_many_gpus_of_a_pool_is_one_incident_and_rack_thermal_groups_neighbours():
    cfg = load_config(DEFAULT_RULES_FILE)
    c = Correlator(cfg.incidents)
    ids = {c.assign(f"fp{i}", {"alertname": "GPUMemoryExhaustionSoon", "category": "capacity", "pool": "rtx",
                                "rack": f"r{i % 3}", "Hostname": f"n{i}"}, at(i)).id for i in range(12)}
    assert len(ids) == 1
    inc = c.incident_of("fp0")
    assert inc is not None and inc.title() == "pool rtx: GPUMemoryExhaustionSoon on 12 GPU(s) of 12 node(s)"
    thermal = {"category": "thermal", "pool": "p"}
    hot = c.assign("hot", {**thermal, "alertname": "GPUTemperatureHigh", "rack": "r1", "Hostname": "a"}, at(0))
    nb = c.assign("nb", {**thermal, "alertname": "GPUThermalThrottle", "rack": "r1", "Hostname": "b"}, at(5))
    other = c.assign("x", {**thermal, "alertname": "GPUThermalThrottle", "pool": "q", "rack": "r2", "Hostname": "c"},
                     at(5))
    assert hot.id == nb.id != other.id
    assert c.needs_drain(hot, "a") and not c.needs_drain(nb, "a")
    # Once everything resolved and the window passed, the same key opens a new incident.
    for fp in ("hot", "nb"):
        c.resolve(fp, at(10))
    later = c.assign("hot", {"alertname": "GPUTemperatureHigh", "category": "thermal", "rack": "r1", "Hostname": "a"},
                     at(10 + 601))
    assert later.id != hot.id


def test_one_fault_across_racks_of_a_pool_is_one_incident_titled_for_the_pool():
    c = Correlator(load_config(DEFAULT_RULES_FILE).incidents)
    hot = {"category": "thermal", "pool": "a100", "alertname": "GPUTemperatureHigh", "severity": "critical"}
    first = c.assign("n1", {**hot, "rack": "r1", "Hostname": "a100-01", "UUID": "GPU-1"}, at(0))
    assert first.correlation == "rack-thermal"
    second, escalates = c.join("n2", {**hot, "rack": "r2", "Hostname": "a100-02", "UUID": "GPU-2"}, at(0.005))
    assert second.id == first.id and second.correlation == "pool-thermal" and escalates
    assert second.title() == ("pool a100: GPUTemperatureHigh on 2 GPU(s) of 2 node(s) (a100-01, a100-02)")
    # A neighbour throttling in rack r1 still joins (every member is thermal in pool a100).
    throttle = c.assign("t", {**hot, "alertname": "GPUThermalThrottle", "severity": "warning", "rack": "r1",
                              "Hostname": "a100-01", "UUID": "GPU-3"}, at(1))
    assert throttle.id == first.id and len(c.incidents) == 1
    # Another pool is another incident; a thermal alert does not join a pool's XID incident.
    other = c.assign("o", {**hot, "pool": "h100", "rack": "h1", "Hostname": "h100-01", "UUID": "GPU-9"}, at(1))
    xid = c.assign("x", {"category": "health", "pool": "b", "alertname": "GPUXidDrain", "rack": "r5",
                         "Hostname": "b-01", "UUID": "GPU-10"}, at(1))
    warm = c.assign("w", {**hot, "pool": "b", "rack": "r5", "Hostname": "b-01", "UUID": "GPU-11"}, at(2))
    assert len({first.id, other.id, xid.id, warm.id}) == 4
    # The pool level joins only within its 2-minute window: another thermal rule in the pool's third rack
    # 3 minutes later is another incident (the same rule in the pool within 10 minutes is one: pool-wide).
    rising = c.assign("n3", {**hot, "alertname": "GPUTemperatureRising", "severity": "warning", "rack": "r3",
                             "Hostname": "a100-03", "UUID": "GPU-12"}, at(1 + 180))
    assert rising.id != first.id
    # The rack level joins a hot rack while it is hot, also after the incident was widened to the pool.
    same_rack = c.assign("n4", {**hot, "rack": "r1", "Hostname": "a100-04", "UUID": "GPU-13"}, at(1 + 700))
    assert same_rack.id == first.id


# --------------------------------------------------------------------------- payloads and delivery rules


def notification(status="firing"):
    d = Dispatcher(build_route(config(ROUTES).route), [])
    d.add(alert("a", severity="critical", Hostname="h100-01", modelName="H100"), at(0))
    [n] = d.flush(at(0), [])[0]
    return n.model_copy(update={"title": "rack r1: GPUTemperatureHigh on 1 GPU(s)", "status": status})


def test_pagerduty_events_v2_trigger_and_resolve_share_a_dedup_key():
    trig = pagerduty.build(notification(), routing_key="k" * 32, external_url="http://wf")
    assert trig["event_action"] == "trigger" and trig["routing_key"] == "k" * 32
    assert set(trig["payload"]) >= {"summary", "source", "severity"} and trig["payload"]["severity"] == "critical"
    res = pagerduty.build(notification("resolved"), routing_key="k" * 32, external_url="http://wf")
    ack = pagerduty.build(notification("acknowledged"), routing_key="k" * 32, external_url="http://wf")
    assert res == {"routing_key": "k" * 32, "event_action": "resolve", "dedup_key": trig["dedup_key"]}
    assert ack["event_action"] == "acknowledge" and ack["dedup_key"] == trig["dedup_key"]


def test_slack_blocks_and_teams_adaptive_card_shapes():
    body = slack.build(notification(), external_url="http://wf")
    assert body["blocks"][0]["type"] == "header" and len(body["blocks"][0]["text"]["text"]) <= 150
    assert body["blocks"][1]["text"]["type"] == "mrkdwn"
    card = teams.build(notification(), external_url="http://wf")
    att = card["attachments"][0]
    assert card["type"] == "message" and att["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert att["content"]["type"] == "AdaptiveCard" and att["content"]["body"][1]["type"] == "FactSet"


def test_webhook_group_payload_matches_alertmanager_v4_keys():
    ours = webhook.build(notification(), receiver="default", external_url="http://wf")
    ref = json.loads((SAMPLES / "alertmanager-0.25-webhook-grouped.json").read_text())
    assert set(ours) == set(ref) and set(ours["alerts"][0]) == set(ref["alerts"][0])
    assert ours["version"] == "4" and ours["groupLabels"] == {"incident": "i1"}


def test_a_group_payload_is_built_as_alertmanager_built_the_reference():
    """The same two alerts through the same route as Alertmanager 0.25 (tests/data/alertmanager): the same
    groupLabels, commonLabels, commonAnnotations and groupKey."""
    ref = json.loads((SAMPLES / "alertmanager-0.25-webhook-grouped.json").read_text())
    cfg = parse_config("""
route:
  receiver: sink
  group_by: [incident]
  routes: [{matchers: ['gpu=~"6|7"'], group_by: [Hostname, alertname], receiver: sink}]
receivers: [{name: sink, type: webhook, url: "http://sink"}]
""")
    intake = Intake(cfg, "whaleflux/alerting/test")
    notes = []
    for a in ref["alerts"]:
        labels = {k: v for k, v in a["labels"].items() if k not in ("alertname", "severity")}
        data = AlertRaised(fingerprint=a["fingerprint"], rule=a["labels"]["alertname"], severity="critical",
                           category="thermal", summary=a["annotations"]["summary"], labels=labels,
                           starts_at=datetime.fromisoformat(a["startsAt"]))
        notes += intake.receive(data, datetime.fromisoformat(a["startsAt"])).notifications
    notes += intake.flush(datetime.fromisoformat(ref["alerts"][1]["startsAt"]) + timedelta(seconds=10)).notifications
    body = webhook.build(notes[-1], receiver="sink", external_url="http://wf")
    assert len(body["alerts"]) == 2
    assert body["groupLabels"] == ref["groupLabels"] and body["groupKey"] == ref["groupKey"]
    ours = {k: v for k, v in body["commonLabels"].items() if k not in ("category", "incident")}
    assert ours == ref["commonLabels"]  # ours also carry category and incident, each common to both here
    # Each alert has the incident's title as an annotation, so commonAnnotations has only what all alerts have.
    assert set(body["commonAnnotations"]) <= {"incident_title"}
    assert all(set(body["commonAnnotations"]) <= set(a["annotations"]) for a in body["alerts"])


def test_an_incident_mixing_rules_leaves_alertname_out_of_common_labels_and_titles_every_alert():
    n = notification()
    mixed = n.model_copy(update={"title": "pool p: A, B on 2 GPU(s)", "alerts": [
        n.alerts[0], n.alerts[0].model_copy(update={"fingerprint": "f2",
                                                    "labels": {**n.alerts[0].labels, "alertname": "Other"}})]})
    body = webhook.build(mixed, receiver="default", external_url="http://wf")
    assert "alertname" not in body["commonLabels"]
    assert body["commonAnnotations"]["incident_title"] == "pool p: A, B on 2 GPU(s)"
    assert body["groupKey"] == '{}/{severity="critical"}:{incident="i1"}'  # the route's path


def test_backoff_grows_to_a_cap_and_respects_retry_after_and_the_bucket_waits():
    assert [backoff_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0] and backoff_s(50) == 60.0
    assert backoff_s(1, retry_after_s=7) == 7
    b = TokenBucket(per_second=2, burst=2)
    assert b.take(0.0) == 0 and b.take(0.0) == 0
    assert b.take(0.0) == pytest.approx(0.5)
    assert b.take(0.5) == 0


# --------------------------------------------------------------------------- noise guards, baselines, incidents


def test_heating_while_a_job_starts_is_no_page_but_heating_at_steady_power_is():
    e = engine("""rules:
  - {name: Rising, kind: rate, metric: temperature_c, per_minute: 15, window: 60s, min_samples: 10,
     steady_metric: power_ratio, steady_tolerance: 0.1, steady_for: 2m, summary: "{per_minute:.0f}"}
""")
    out = []
    temp = 30.0
    for t in range(0, 300):  # idle, then a job starts at t=60: power jumps, the GPU heats 40 C in a minute or two
        busy = t >= 60
        target = 70.0 if busy else 30.0
        temp += (target - temp) / 30
        out += e.observe_telemetry(batch(t, sample(temperature_c=round(temp, 1), power_w=650 if busy else 75,
                                                   power_limit_w=700)), T0)
    assert fired(out) == []
    for t in range(300, 330):  # same power, cooling fails: +1 C/s
        temp += 1.0
        out += e.observe_telemetry(batch(t, sample(temperature_c=temp, power_w=650, power_limit_w=700)), T0)
    assert fired(out) == ["Rising"]


def test_a_job_stepping_memory_up_is_no_leak_but_steady_growth_is():
    e = engine("rules:\n  - {name: Leak, kind: trend, window: 2m, within: 10m, min_samples: 20, min_slope_per_s: 8,"
               " summary: s}\n")
    out = []
    for t in range(300):  # a job starts at t=100 and takes 60 GB at once
        out += e.observe_telemetry(batch(t, sample(memory_used_mib=512 if t < 100 else 60_000)), T0)
    assert fired(out) == []
    for t in range(300, 420):  # then leaks 40 MiB/s: 21 GB left -> ~9 min
        out += e.observe_telemetry(batch(t, sample(memory_used_mib=60_000 + 40 * (t - 300))), T0)
    assert fired(out) == ["Leak"]


def test_a_leak_is_projected_from_its_recent_slope_with_the_real_time_left():
    e = engine("rules:\n  - {name: Leak, kind: trend, window: 2m, within: 10m, min_samples: 20, min_slope_per_s: 8,"
               " summary: '{slope_per_s:.0f} MiB/s, full in {eta_min:.1f} min'}\n")
    total, start = 81559, 72_000  # 9559 MiB free: a 20 MiB/s leak fills it in 8 min
    out = []
    for t in range(400):  # flat, then a 20 MiB/s leak from t=120 (same process: the window is not restarted)
        used = start if t < 120 else start + 20 * (t - 120)
        out += e.observe_telemetry(batch(t, sample(memory_used_mib=used, memory_total_mib=total)), T0)
        if out:
            break
    [tr] = out
    used = start + 20 * (t - 120)
    real_min = (total - used) / 20 / 60
    rate, left = tr.summary.split(" MiB/s, full in ")
    assert rate == "20" and abs(float(left.removesuffix(" min")) - real_min) < 0.15, (tr.summary, real_min)


def _proc(job: str):
    from whaleflux.shared.events import GpuProcess

    return [GpuProcess(pid=1, used_mib=1000, job_id=job)]


def test_baselines_per_model_and_workload_class_with_settle():
    e = engine("""rules:
  - {name: Odd, kind: baseline, metric: temperature_c, by: [model, workload_class], settle: 60s, half_life: 30m,
     warm_up: 100, sigmas: 5, min_delta: 8, summary: "{value:.0f} vs {mean:.0f} ({workload_class})"}
""")
    e.observe_job("train-1", "llm-train")
    e.observe_job("infer-1", "inference")
    gpus = [f"GPU-{i}" for i in range(8)]
    out = []
    for t in range(200):
        # Four GPUs train (hot, ~70 C), four serve inference (~50 C): each class has its own normal.
        samples = [sample(uuid=u, index=i, temperature_c=70 + (i % 2) + (t % 3) * 0.5, processes=_proc("train-1"))
                   for i, u in enumerate(gpus[:4])]
        samples += [sample(uuid=u, index=4 + i, temperature_c=50 + (t % 2), utilization_gpu_pct=40,
                           processes=_proc("infer-1"))
                    for i, u in enumerate(gpus[4:])]
        out += e.observe_telemetry(batch(t, *samples), T0)
    assert fired(out) == []
    assert e.workload_class(sample(processes=_proc("infer-1"))) == "inference"
    assert e.workload_class(sample(utilization_gpu_pct=0)) == "idle"
    assert e.workload_class(sample(processes=_proc("not-ours"))) == "unknown"
    # An inference GPU takes a training job: 70 C is normal for training, but first it settles (not judged).
    moved = sample(uuid=gpus[4], index=4, temperature_c=85, processes=_proc("train-1"))
    assert fired(e.observe_telemetry(batch(200, moved), T0)) == []
    later = sample(uuid=gpus[4], index=4, temperature_c=71, processes=_proc("train-1"))
    for t in range(201, 270):
        out += e.observe_telemetry(batch(t, later), T0)
    assert fired(out) == []
    # Under training, 85 C is far above the training normal of that model: fires, and it says which class.
    [hot] = [tr for tr in e.observe_telemetry(batch(270, sample(uuid=gpus[0], index=0, temperature_c=85,
                                                                 processes=_proc("train-1"))), T0) if tr.firing]
    assert hot.summary.endswith("(llm-train)") and hot.summary.startswith("85 vs 71")
    assert {k[1:] for k in e.baselines.ewmas} == {("H100", "llm-train"), ("H100", "inference")}


def test_several_symptoms_of_one_gpu_are_one_incident_and_old_incidents_take_no_new_faults():
    c = Correlator(load_config(DEFAULT_RULES_FILE).incidents)
    gpu = {"UUID": "GPU-a", "Hostname": "h200-01", "pool": "cloud", "category": "health"}
    ecc = c.assign("ecc", {**gpu, "alertname": "GPUUncorrectableECC"}, at(0))
    remap = c.assign("remap", {**gpu, "alertname": "GPURemappedRowsUncorrectable"}, at(1))
    assert ecc.id == remap.id
    assert ecc.title() == "pool cloud: GPURemappedRowsUncorrectable, GPUUncorrectableECC on 1 GPU(s) of 1 node(s)"
    # A GPU fallen off the bus never resolves; an XID on another GPU of the pool 30 minutes later is a new incident.
    xid = {"pool": "onprem", "alertname": "GPUXidDrain"}
    lost = c.assign("x79", {**xid, "UUID": "GPU-b", "Hostname": "a100-01"}, at(0))
    soon = c.assign("x79b", {**xid, "UUID": "GPU-c", "Hostname": "a100-02"}, at(120))
    late = c.assign("x48", {**xid, "UUID": "GPU-d", "Hostname": "h100-01"}, at(1800 + 120))
    assert lost.id == soon.id != late.id


def test_running_window_slope_matches_the_full_least_squares_fit():
    import random

    from whaleflux.alerting.rules.trend import Window, slope_per_s

    rng, w, t = random.Random(7), Window(), 1.8e9
    for i in range(1, 200_000):
        t += rng.uniform(0.5, 1.5)
        w.push(t, rng.gauss(50, 5) + 0.01 * i, 60)
        if i % 20_000 == 0:  # across rebasing (daily) too
            fast, exact = w.slope(), slope_per_s(list(w))
            assert fast is not None and exact is not None and abs(fast - exact) < 1e-6


def test_nvlink_links_going_down_fire_the_shipped_degraded_rule_after_its_for():
    rules = RuleEngine(load_config(DEFAULT_RULES_FILE), gpu_models())

    def run(t, gpu, node="h100-01"):
        return rules.observe_telemetry(batch(t, gpu, node=node), T0 + timedelta(seconds=t))

    assert "NVLinkDegraded" not in fired(run(0, sample(nvlink_links_active=18)))
    early = [tr for t in range(1, 25) for tr in run(t, sample(nvlink_links_active=16))]
    assert "NVLinkDegraded" not in fired(early)  # a link flapping for seconds is not paged (for: 30s)
    later = [tr for t in range(25, 40) for tr in run(t, sample(nvlink_links_active=16))]
    assert fired(later).count("NVLinkDegraded") == 1
    # An RTX 4090 has no NVLink: the rule has no threshold for it and stays quiet.
    quiet = [tr for t in range(40, 80)
             for tr in run(t, sample(uuid="GPU-2", model="RTX4090", memory_total_mib=24564), node="r4090-01")]
    assert "NVLinkDegraded" not in fired(quiet)
