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


def test_a_critical_drain_rule_asks_for_a_drain_once_per_node_and_cause():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    first = intake.receive(raised("a"), at(0))
    [drain] = first.drains
    assert drain.subject == subjects.node_drain_requested("c", "h1") and drain.envelope.time == at(0)
    request = NodeDrainRequested.model_validate(drain.envelope.data)
    assert (request.node, request.fingerprint, request.reason) == ("h1", "a", "Hot: a Hot")
    assert drain.envelope.id == f"drain-c-h1-a-{int(at(0).timestamp() * 1000)}"
    assert intake.receive(raised("a"), at(1)).drains == []  # the same firing redelivered: nothing new
    # Another GPU of the drained node (a second cause) asks again, with its own id: the node may have been
    # undrained since, and the scheduler ignores a request for a node that is draining.
    [again] = intake.receive(raised("b"), at(1)).drains
    assert again.envelope.id != drain.envelope.id and again.subject == drain.subject
    assert intake.receive(raised("w", rule="Warm", node="h2", severity="warning"), at(2)).drains == []  # not critical
    [inc] = first.incidents
    assert inc.drained_nodes == ["c/h1"] and len(inc.drain_requests) == 2


def test_an_undrain_makes_the_incident_forget_its_drains_there():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    [inc] = intake.receive(raised("a"), at(0)).incidents
    assert [i.id for i in intake.undrained("c", "h1").incidents] == [inc.id]
    assert inc.drained_nodes == [] and inc.drain_requests == []
    assert intake.undrained("c", "h1").incidents == []


def test_a_new_critical_gpu_inside_an_open_incident_pages_at_once_as_an_escalation_and_drains():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    [first] = intake.receive(raised("a"), at(0)).notifications  # incident "h1" (correlated by Hostname)
    assert not first.escalation and first.title == "h1: Hot"
    # A warning on the node at 2 s is an update, sent at the group_interval (10 s), not now.
    assert intake.receive(raised("w", rule="Warm", severity="warning", t=2), at(2)).notifications == []
    # A second GPU overheating at 3 s: a page now (not at 10 s), titled as an escalation, and its own drain.
    changes = intake.receive(raised("b", t=3), at(3))
    [page] = changes.notifications
    assert page.escalation and page.escalations == 1 and page.title.startswith("Escalation: h1:")
    assert {a.fingerprint for a in page.alerts} == {"a", "b", "w"}
    assert len(changes.drains) == 1 and changes.incidents[0].escalations == 1
    # The same GPU's alert firing again (redelivered) is not another escalation.
    assert intake.receive(raised("b", t=3), at(4)).notifications == []


def test_a_critical_alert_escalates_an_incident_that_had_only_warnings():
    intake = Intake(CONFIG, "whaleflux/alerting/test")
    [warn] = intake.receive(raised("w", rule="Warm", severity="warning"), at(0)).notifications
    assert not warn.escalation
    [page] = intake.receive(raised("a", t=1), at(1)).notifications
    assert page.escalation


def test_a_gpu_that_only_warned_escalates_when_it_turns_critical_even_if_another_gpu_is_critical():
    intake = Intake(CONFIG, "whaleflux/alerting/test")

    def on(fp: str, uuid: str, rule: str = "Hot", severity: Severity = "critical", t: float = 0) -> AlertRaised:
        a = raised(fp, rule=rule, severity=severity, t=t)
        return a.model_copy(update={"labels": {**a.labels, "UUID": uuid}})

    intake.receive(on("a", "GPU-0"), at(0))  # GPU 0 critical: the incident pages
    intake.receive(on("w", "GPU-1", "Warm", "warning", t=1), at(1))  # GPU 1 warns: an update
    [page] = intake.receive(on("b", "GPU-1", t=2), at(2)).notifications  # GPU 1 critical now: a page
    assert page.escalation
    # Another critical symptom of a GPU already critical here is an update, not another page.
    assert intake.receive(on("c", "GPU-1", "Warm", t=3), at(3)).notifications == []


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
