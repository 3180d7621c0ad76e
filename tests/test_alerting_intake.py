"""The pure steps between rules and delivery: transitions -> alert events (firing.py), alert events -> groups,
incidents, titled notifications and drain requests (dispatch/intake.py). Time passed in; no Redis, no bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whaleflux.alerting.config import Severity, parse_config
from whaleflux.alerting.dispatch.intake import Ack, Intake
from whaleflux.alerting.firing import FiringAlerts
from whaleflux.alerting.rules.series import Transition
from whaleflux.shared import subjects
from whaleflux.shared.events import AlertRaised, AlertResolved, NodeDrainRequested

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

CONFIG = parse_config("""
rules:
  - {name: Hot, kind: threshold, metric: temperature_c, threshold: {value: 90}, severity: critical, summary: hot,
     actions: [drain]}
  - {name: Warm, kind: threshold, metric: temperature_c, threshold: {value: 80}, summary: warm, actions: [drain]}
route: {receiver: pd, group_wait: 0s, group_interval: 10s}
receivers: [{name: pd, type: pagerduty, routing_key: k}]
incidents:
  correlate: [{name: node, by: [Hostname], title: "{Hostname}: {alertnames}"}]
""")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def raised(fp: str, rule: str = "Hot", node: str = "h1", severity: Severity = "critical", t: float = 0) -> AlertRaised:
    return AlertRaised(fingerprint=fp, rule=rule, severity=severity, summary=f"{fp} {rule}",
                       labels={"Hostname": node, "cluster": "c"}, starts_at=at(t))


def test_a_transition_becomes_one_event_with_a_stable_id_and_the_clocks_time():
    rule = CONFIG.rules[0]
    book = FiringAlerts("whaleflux/alerting/test")
    fire = Transition(True, rule, "fp", {"Hostname": "h1"}, "hot", at(0), 95.0)
    change = book.change(fire, at(3))
    assert change is not None and change.subject == subjects.ALERT_RAISED
    assert change.envelope.id == f"raised-fp-{int(at(0).timestamp() * 1000)}" and change.envelope.time == at(3)
    assert book.alerts == {}  # nothing kept until the change is stored
    book.commit(change)
    assert book.change(fire, at(4)) is None  # already firing
    clear = book.change(Transition(False, rule, "fp", {"Hostname": "h1"}, "ok", at(9)), at(9))
    assert clear is not None and isinstance(clear.alert, AlertResolved) and clear.alert.ends_at == at(9)
    book.commit(clear)
    assert book.alerts == {} and book.change(Transition(False, rule, "fp", {}, "ok", at(10)), at(10)) is None


def test_a_critical_drain_rule_asks_for_a_drain_once_per_node_per_incident():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    first = intake.receive(raised("a"), at(0))
    [drain] = first.drains
    assert drain.subject == subjects.node_drain_requested("c", "h1") and drain.envelope.time == at(0)
    request = NodeDrainRequested.model_validate(drain.envelope.data)
    assert (request.node, request.fingerprint, request.reason) == ("h1", "a", "Hot: a Hot")
    assert drain.envelope.id == f"drain-{first.incidents[0].id}-c-h1"
    assert intake.receive(raised("b"), at(1)).drains == []  # same node, same incident
    assert intake.receive(raised("w", rule="Warm", node="h2", severity="warning"), at(2)).drains == []  # not critical
    [inc] = first.incidents
    assert inc.drained_nodes == ["c/h1"]


def test_notifications_are_titled_with_their_incident_and_an_ack_sends_acknowledge():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    [n] = intake.receive(raised("a"), at(0)).notifications
    assert n.status == "firing" and n.title == "h1: Hot"
    ack = Ack(by="oncall", at=at(5), starts_at=at(0))
    changes = intake.acknowledge("a", ack, at(5))
    assert [x.status for x in changes.notifications] == ["acknowledged"] and set(changes.groups)
    assert intake.acked(raised("a")) == ack
    assert intake.acked(raised("a", t=60)) is None  # a later firing of the same alert is not acknowledged


def test_a_resolution_reaches_the_group_that_was_told_it_fired():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    intake.receive(raised("a"), at(0))
    gone = AlertResolved(fingerprint="a", rule="Hot", labels={"Hostname": "h1", "cluster": "c"}, summary="ok",
                         starts_at=at(0), ends_at=at(20))
    changes = intake.receive(gone, at(20))
    assert [n.status for n in changes.notifications] == ["resolved"] and changes.removed
    assert changes.incidents and changes.incidents[0].firing_count() == 0
