"""Alertmanager's v2 models both ways (amv2.py) and the `alertmanager` receiver's body, without servers."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.alerting import amv2
from whaleflux.alerting.config import parse_config
from whaleflux.alerting.delivery.directory import Directory
from whaleflux.alerting.dispatch.groups import GroupedAlert, Notification, NotifiedAlert
from whaleflux.alerting.receivers import alertmanager
from whaleflux.shared.events import AlertRaised, AlertResolved

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_alertmanager_receiver_posts_postable_alerts_to_api_v2_alerts():
    cfg = parse_config('receivers: [{name: am, type: alertmanager, url: "http://am:9093/"}]\nroute: {receiver: am}\n')
    assert Directory(cfg.receivers, {}).urls(cfg.receivers[0]) == ["http://am:9093/api/v2/alerts"]
    firing = NotifiedAlert(status="firing", fingerprint="f", labels={"alertname": "Hot"}, annotations={"summary": "s"},
                           starts_at=T0)
    done = firing.model_copy(update={"status": "resolved", "fingerprint": "g", "ends_at": T0 + timedelta(minutes=1)})
    n = Notification(id="g-1", receiver="am", group_key="g", group_labels={}, status="firing",
                     alerts=[firing, done], created_at=T0, title="t")
    body = alertmanager.build(n, external_url="http://wf")
    assert [set(a) for a in body] == [{"labels", "annotations", "startsAt", "endsAt", "generatorURL"}] * 2
    assert body[0]["endsAt"] == "2026-12-02T12:00:00Z"  # held while firing: each notification extends it
    assert body[1]["endsAt"] == "2026-12-01T12:01:00Z" and body[0]["annotations"]["incident_title"] == "t"


def test_posted_alerts_become_alert_events_that_end_as_alertmanager_ends_them():
    raw = {"labels": {"alertname": "DiskFull", "severity": "page", "Hostname": "s1"},
           "annotations": {"summary": "full"}, "startsAt": "2026-12-01T11:59:00Z", "endsAt": "0001-01-01T00:00:00Z"}
    event_id, data = amv2.alert_event(amv2.PostableAlert.model_validate(raw), T0)
    assert isinstance(data, AlertRaised) and data.rule == "DiskFull" and data.summary == "full"
    assert data.severity == "warning" and data.labels == {"Hostname": "s1", "severity_label": "page"}
    # No endsAt: it ends resolve_timeout (5 minutes) after it was posted, unless posted again.
    assert data.ends_at == T0 + timedelta(minutes=5)
    assert amv2.alert_event(amv2.PostableAlert.model_validate(raw), T0)[0] == event_id  # the same post: one event
    later_id, later = amv2.alert_event(amv2.PostableAlert.model_validate(raw), T0 + timedelta(minutes=1), 60)
    assert later_id != event_id and later.ends_at == T0 + timedelta(minutes=2)  # re-sent: extended
    # An endsAt in the future (Prometheus sends now + 4 evaluation intervals) is its end as it stands.
    ahead = {**raw, "endsAt": "2026-12-01T12:03:00Z"}
    _, until = amv2.alert_event(amv2.PostableAlert.model_validate(ahead), T0)
    assert isinstance(until, AlertRaised) and until.ends_at == T0 + timedelta(minutes=3)
    ended = {**raw, "endsAt": "2026-12-01T11:59:30Z"}
    _, resolved = amv2.alert_event(amv2.PostableAlert.model_validate(ended), T0)
    assert isinstance(resolved, AlertResolved) and resolved.fingerprint == data.fingerprint


def test_silences_both_ways_and_filters():
    body = amv2.PostableSilence.model_validate({
        "matchers": [{"name": "Hostname", "value": "h1", "isRegex": False},
                     {"name": "gpu", "value": "6|7", "isRegex": True, "isEqual": False}],
        "startsAt": "2026-12-01T11:00:00Z", "endsAt": "2026-12-01T13:00:00Z", "createdBy": "me", "comment": "work"})
    s = amv2.silence_of(body, "s1", T0)
    assert s.matchers == ['Hostname="h1"', 'gpu!~"6|7"'] and s.starts_at == T0  # a start in the past is now
    out = amv2.gettable_silence(s, T0)
    assert out["status"] == {"state": "active"} and out["matchers"][1] == {
        "name": "gpu", "value": "6|7", "isRegex": True, "isEqual": False}
    with pytest.raises(ValueError, match="endsAt"):
        amv2.silence_of(body.model_copy(update={"ends_at": T0 - timedelta(seconds=1)}), "s2", T0)
    with pytest.raises(ValueError, match="comment"):
        amv2.silence_of(body.model_copy(update={"comment": " "}), "s2", T0)
    assert [str(m) for m in amv2.parse_filters(['{a="x,y",b=~"c"}', "d!=e"])] == ['a="x,y"', 'b=~"c"', 'd!="e"']
    with pytest.raises(ValueError):
        amv2.parse_filters(["not a matcher"])


def test_a_gettable_alert_is_suppressed_when_silenced_or_inhibited_and_the_filters_follow_alertmanager():
    a = GroupedAlert(fingerprint="f", labels={"alertname": "Hot", "Hostname": "h1"}, starts_at=T0)
    active = amv2.gettable_alert(a, ["pd", "hook"], [], [], "http://wf")
    muted = amv2.gettable_alert(a, ["hook"], ["s1"], [], "http://wf")
    assert active["status"]["state"] == "active" and active["receivers"] == [{"name": "hook"}, {"name": "pd"}]
    assert muted["status"] == {"state": "suppressed", "silencedBy": ["s1"], "inhibitedBy": [], "mutedBy": []}
    hot = amv2.parse_filters(['alertname="Hot"'])
    assert amv2.wanted(active, hot, None, True, True, True)
    assert not amv2.wanted(active, hot, None, False, True, True)  # active=false
    assert not amv2.wanted(muted, hot, None, True, False, True)  # silenced=false
    assert not amv2.wanted(active, amv2.parse_filters(['alertname="Cold"']), None, True, True, True)

    assert not amv2.wanted(muted, [], re.compile("pd"), True, True, True)

