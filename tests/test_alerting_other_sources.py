"""Alerts from other sources (billing's budget alerts, issue 17 defect 9; alerts posted to /api/v2/alerts) are
titled by what they say, listed like our own, and resolve at their end (Alertmanager's endsAt). The shipped rules
through the intake, time passed in; the delivery queue's read against real Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config
from whaleflux.alerting.delivery.model import Delivery
from whaleflux.alerting.dispatch.groups import Notification
from whaleflux.alerting.dispatch.intake import Intake
from whaleflux.alerting.store import AlertStore
from whaleflux.shared.events import AlertRaised, AlertResolved

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PROJECTED_80 = "Team nlp projected to spend $8,400.00 in December 2026, 84% of its $10,000.00 budget (threshold 80%)"
PROJECTED_100 = ("Team nlp projected to spend $12,000.00 in December 2026, 120% of its $10,000.00 budget "
                 "(threshold 100%; $5,000.00 spent so far)")


def budget(threshold: int, summary: str, t: float = 0) -> AlertRaised:
    """As billing publishes it (services/billing/service.py check_budgets)."""
    fp = f"cost-budget-team-nlp-202612-{threshold}"
    return AlertRaised(fingerprint=fp, rule="BudgetProjection", severity="critical" if threshold >= 100 else "warning",
                       category="cost", summary=summary, value=float(threshold) + 4,
                       labels={"alertname": "BudgetProjection", "scope": "team", "name": "nlp", "period": "2026-12",
                               "threshold_pct": str(threshold)},
                       starts_at=T0 + timedelta(seconds=t))


def test_a_budget_alert_is_titled_with_who_how_much_and_the_forecast():
    intake = Intake(load_config(DEFAULT_RULES_FILE), "whaleflux/alerting/test")
    first = intake.receive(budget(80, PROJECTED_80), T0)
    late = intake.flush(T0 + timedelta(seconds=31))  # the cost route waits 30 s
    [note] = first.notifications + late.notifications
    assert note.title == PROJECTED_80 and note.receiver == "finops"
    # The same budget crossing 100% later that month: the same incident, titled by its latest alert.
    intake.receive(budget(100, PROJECTED_100, t=3600), T0 + timedelta(seconds=3600))
    [incident] = intake.correlator.incidents.values()
    assert incident.correlation == "budget" and incident.title() == PROJECTED_100
    assert len(incident.members) == 2


def test_an_alert_of_no_node_and_no_correlation_is_titled_by_its_rule_and_summary():
    intake = Intake(load_config(DEFAULT_RULES_FILE), "whaleflux/alerting/test")
    posted = AlertRaised(fingerprint="fp1", rule="DiskFull", severity="warning", summary="/data 97% full",
                         labels={"mount": "/data"}, starts_at=T0)
    [note] = intake.receive(posted, T0).notifications
    assert note.title == "DiskFull: /data 97% full"
    hot = AlertRaised(fingerprint="fp2", rule="GPUTemperatureHigh", severity="critical", category="thermal",
                      summary="hot", labels={"Hostname": "h1", "cluster": "c", "rack": "r1", "pool": "p"},
                      starts_at=T0)
    [note] = intake.receive(hot, T0).notifications
    assert note.title.startswith("rack r1: GPUTemperatureHigh on 1 GPU(s)")


def test_other_sources_alerts_are_listed_as_they_were_raised_and_ours_are_not_listed_twice():
    intake = Intake(load_config(DEFAULT_RULES_FILE), "whaleflux/alerting/test")
    raised = budget(100, PROJECTED_100)
    intake.receive(raised, T0)
    ours = AlertRaised(fingerprint="fp-hot", rule="GPUTemperatureHigh", severity="critical", category="thermal",
                       summary="hot", labels={"Hostname": "h1", "cluster": "c"}, starts_at=T0)
    intake.receive(ours, T0)
    # As billing sent it (its `alertname` label is the rule); our rule's alert is not listed here.
    as_sent = raised.model_copy(update={"labels": {k: v for k, v in raised.labels.items() if k != "alertname"}})
    assert intake.others() == [as_sent]
    intake.receive(AlertResolved(fingerprint=raised.fingerprint, rule=raised.rule, labels=raised.labels,
                                 summary=raised.summary, starts_at=T0, ends_at=T0 + timedelta(hours=1)),
                   T0 + timedelta(hours=1))
    assert intake.others() == []


def test_a_posted_alert_resolves_at_its_end_unless_posted_again_with_a_later_one():
    config = load_config(DEFAULT_RULES_FILE)
    intake = Intake(config, "whaleflux/alerting/test")
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731

    def posted(ends_s: float) -> AlertRaised:
        return AlertRaised(fingerprint="fp-disk", rule="DiskFull", severity="critical", summary="/data full",
                           labels={"mount": "/data"}, starts_at=T0, ends_at=at(ends_s))

    [first] = intake.receive(posted(60), at(0)).notifications
    assert first.status == "firing"
    assert intake.flush(at(59)).notifications == [] and intake.others()[0].ends_at == at(60)
    assert intake.dispatcher.next_due() == at(60)  # its end is due before the group's next flush (64 s)
    extended = intake.receive(posted(120), at(59.5))  # re-sent before its end: extended, nothing new to say
    assert extended.notifications == [] and extended.groups and intake.others()[0].ends_at == at(120)
    assert intake.flush(at(61)).notifications == [] and [a.fingerprint for a in intake.others()] == ["fp-disk"]
    ended = intake.flush(at(121))
    [note] = ended.notifications
    assert note.status == "resolved" and note.alerts[0].ends_at == at(120)
    assert intake.others() == [] and ended.incidents[0].firing_count() == 0
    # Posted (or replayed) after its end: nothing fires, nothing is said.
    again = Intake(config, "whaleflux/alerting/test")
    assert again.receive(posted(60), at(61)).notifications == [] and again.others() == []
    assert again.dispatcher.groups == {}


async def test_due_deliveries_come_in_one_round_trip_and_an_id_without_its_record_is_dropped(bus_and_redis):
    _, redis = bus_and_redis
    store = AlertStore(SimpleNamespace(redis=redis, outbox=None), "wf:test-alerting")
    note = Notification(id="g-1", receiver="hook", group_key="g", group_labels={}, status="firing", alerts=[],
                        created_at=T0)
    due = [Delivery(id=f"d{i}", receiver="hook", receiver_type="webhook", notification=note, created_at=T0)
           for i in range(3)]
    await redis.zadd(store.queue, {"d0": T0.timestamp(), "d1": T0.timestamp() + 1, "gone": T0.timestamp() + 2,
                                   "d2": T0.timestamp() + 3, "later": T0.timestamp() + 60})
    records = {d.id: d.model_dump_json() for d in due} | {"later": due[0].model_dump_json()}
    await redis.hset(store.delivery, mapping=records)
    got = await store.due(T0 + timedelta(seconds=10))
    assert [d.id for d in got] == ["d0", "d1", "d2"] and got[1] == due[1]  # oldest due first, "later" not yet
    assert await redis.zscore(store.queue, "gone") is None  # queued without its record: dropped
    assert await store.due(T0 - timedelta(seconds=1)) == []
