"""The delivery pipeline, stage by stage, without Redis or HTTP: resolve receiver, inhibit and silence, rate limit,
render, post (tenacity tries, then back in the queue), record."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from whaleflux.alerting.config import parse_config
from whaleflux.alerting.delivery.directory import Directory
from whaleflux.alerting.delivery.model import Delivery, DeliveryError
from whaleflux.alerting.delivery.pipeline import Pipeline, standard
from whaleflux.alerting.delivery.stages import (
    Finished,
    Job,
    Later,
    Mute,
    Post,
    RateLimit,
    Render,
    ResolveReceiver,
    record,
)
from whaleflux.alerting.dispatch.groups import Notification, NotifiedAlert
from whaleflux.alerting.dispatch.intake import Intake
from whaleflux.alerting.dispatch.silences import Silence
from whaleflux.shared.events import AlertRaised

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

CONFIG = """
route: {receiver: hook}
receivers:
  - {name: hook, type: webhook, url_env: HOOK_URLS}
  - {name: pd, type: pagerduty, routing_key_env: PD_KEY}
  - {name: slow, type: slack, url: "http://slack", rate_limit: {per_second: 1, burst: 2}}
  - {name: quiet, type: webhook, url: "http://quiet", send_resolved: false}
inhibit_rules:
  - {source_matchers: [alertname="NodeDown"], target_matchers: [alertname!="NodeDown"], equal: [Hostname]}
"""
ENV = {"HOOK_URLS": "http://a, http://b", "PD_KEY": "k" * 32}


def directory(env: dict[str, str] | None = None) -> Directory:
    return Directory(parse_config(CONFIG).receivers, ENV if env is None else env)


def firing(fp: str, **labels: str) -> NotifiedAlert:
    return NotifiedAlert(status="firing", fingerprint=fp, starts_at=T0, annotations={"summary": f"{fp} is hot"},
                         labels={"alertname": "Hot", "severity": "critical", "Hostname": "n1", **labels})


def note(receiver: str = "hook", status: str = "firing", *alerts: NotifiedAlert) -> Notification:
    return Notification(id="g-1", receiver=receiver, group_key="g", group_labels={"incident": "inc-1"},
                        status=status, alerts=list(alerts) or [firing("a")], created_at=T0)


def delivery(receiver: str = "hook", url_index: int = 0, n: Notification | None = None) -> Delivery:
    return Delivery(id=f"g-1@{receiver}#{url_index}", receiver=receiver, receiver_type="webhook",
                    url_index=url_index, notification=n or note(receiver), created_at=T0)


def resolved(job: Job) -> Job:
    assert ResolveReceiver(directory)(job) is None
    return job


# --------------------------------------------------------------------------- resolve receiver


def test_receiver_urls_come_from_the_environment_and_each_url_is_one_delivery():
    plan = directory().plan(note())
    assert [(d.id, d.url_index) for d in plan] == [("g-1@hook#0", 0), ("g-1@hook#1", 1)]
    job = resolved(Job(plan[1], T0))
    assert job.receiver is not None and job.receiver.urls == ["http://a", "http://b"]


def test_a_receiver_that_cannot_be_reached_is_skipped_with_the_reason():
    assert ResolveReceiver(directory)(Job(delivery("gone"), T0)) == Finished(
        "skipped", None, "no receiver named 'gone' in the rules file")
    no_urls = ResolveReceiver(lambda: directory({}))(Job(delivery(), T0))
    assert no_urls == Finished("skipped", None, "no URL configured for this receiver")
    no_key = ResolveReceiver(lambda: directory({}))(Job(delivery("pd"), T0))
    assert no_key == Finished("skipped", None, "routing key not set (PD_KEY)")


def test_only_pagerduty_hears_acknowledgements_and_send_resolved_false_hears_no_resolution():
    d = directory()
    assert d.plan(note("hook", "acknowledged")) == []
    assert [x.receiver_type for x in d.plan(note("pd", "acknowledged"))] == ["pagerduty"]
    assert d.plan(note("quiet", "resolved")) == [] and len(d.plan(note("quiet", "firing"))) == 1


# --------------------------------------------------------------------------- inhibit and silence


def intake_with(*firing_alerts: AlertRaised) -> Intake:
    intake = Intake(parse_config(CONFIG), "test")
    for a in firing_alerts:
        intake.receive(a, T0)
    return intake


def raised(fp: str, rule: str, node: str) -> AlertRaised:
    return AlertRaised(fingerprint=fp, rule=rule, severity="critical", summary=fp, labels={"Hostname": node},
                       starts_at=T0)


def muter(intake: Intake) -> Mute:
    def muted(labels: dict[str, str], fp: str, now: datetime) -> bool:
        silences, inhibited = intake.muted(labels, fp, now)
        return bool(silences) or inhibited

    return Mute(muted)


def test_alerts_silenced_or_inhibited_after_queueing_are_left_out_and_an_all_muted_message_is_skipped():
    intake = intake_with(raised("down", "NodeDown", "n1"))
    n = note("hook", "firing", firing("a", Hostname="n1"), firing("b", Hostname="n2"))
    job = Job(delivery(n=n), T0)
    assert muter(intake)(job) is None
    assert job.notification is not None and [a.fingerprint for a in job.notification.alerts] == ["b"]  # inhibited

    intake.silences["s"] = Silence(id="s", matchers=['Hostname="n2"'], starts_at=T0, ends_at=T0 + timedelta(hours=1),
                                   created_by="ops", comment="maintenance")
    assert muter(intake)(Job(delivery(n=n), T0)) == Finished("skipped", None,
                                                             "silenced or inhibited since it was queued")
    # After the silence ends only the inhibition (NodeDown still fires on n1) holds back an alert.
    later = Job(delivery(n=n), T0 + timedelta(hours=2))
    assert muter(intake)(later) is None
    assert later.notification is not None and [a.fingerprint for a in later.notification.alerts] == ["b"]
    assert muter(Intake(parse_config(CONFIG), "test"))(Job(delivery(n=n), T0)) is None  # nothing fires: nothing muted


def test_a_resolution_is_never_muted():
    intake = intake_with(raised("down", "NodeDown", "n1"))
    gone = NotifiedAlert(status="resolved", fingerprint="a", starts_at=T0, ends_at=T0, labels={"Hostname": "n1"},
                         annotations={})
    n = note("hook", "resolved", gone)
    job = Job(delivery(n=n), T0)
    assert muter(intake)(job) is None and job.notification == n


# --------------------------------------------------------------------------- rate limit, render


def test_rate_limit_lets_the_burst_through_then_the_delivery_waits_for_a_token():
    limit = RateLimit()
    jobs = [resolved(Job(delivery("slow"), T0)) for _ in range(3)]
    assert [limit(j) for j in jobs] == [None, None, Later(T0 + timedelta(seconds=1))]
    assert limit(resolved(Job(delivery("slow"), T0 + timedelta(seconds=1)))) is None  # refilled
    assert limit(resolved(Job(delivery(), T0))) is None  # no limit configured
    limit.reset()
    assert limit(resolved(Job(delivery("slow"), T0 + timedelta(seconds=1)))) is None


def test_render_gives_each_receiver_its_body():
    pd = resolved(Job(delivery("pd"), T0))
    Mute(lambda *_: False)(pd)
    assert Render("http://wf")(pd) is None
    assert isinstance(pd.body, dict) and pd.body["routing_key"] == "k" * 32 and pd.body["event_action"] == "trigger"
    hook = resolved(Job(delivery(), T0))
    Render("http://wf")(hook)
    assert isinstance(hook.body, dict) and hook.body["version"] == "4" and hook.body["receiver"] == "hook"


# --------------------------------------------------------------------------- post


class Endpoint:
    """A receiver stand-in for the post stage: answers with the given statuses in turn (503/429/404 raise)."""

    def __init__(self, *answers: int, retry_after_s: float | None = None) -> None:
        self.answers = list(answers)
        self.retry_after_s = retry_after_s
        self.posts: list[str] = []

    async def __call__(self, url: str, body: dict[str, Any] | list[dict[str, Any]]) -> int:
        self.posts.append(url)
        status = self.answers.pop(0) if self.answers else 200
        if status >= 400:
            raise DeliveryError(f"receiver answered {status}", retryable=status >= 500 or status == 429,
                                status=status, retry_after_s=self.retry_after_s)
        return status


def post(endpoint: Endpoint, job: Job, max_age_s: float = 3600) -> tuple[object, list[float]]:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    resolved(job)
    Render("http://wf")(job)
    return asyncio.run(Post(endpoint, max_age_s, sleep=sleep)(job)), waits


def test_post_tries_three_times_at_once_then_delivers():
    job = Job(delivery(url_index=1), T0)
    outcome, waits = post(Endpoint(503, 503, 202), job)
    assert outcome == Finished("delivered", 202, None)
    assert waits == [0.5, 1.0] and job.delivery.attempts == 3


def test_post_goes_back_in_the_queue_with_back_off_after_its_tries():
    endpoint = Endpoint(503, 503, 503)
    job = Job(delivery(), T0)
    outcome, _ = post(endpoint, job)
    assert outcome == Later(T0 + timedelta(seconds=2), "receiver answered 503")
    assert job.delivery.attempts == 3 and job.delivery.last_error == "receiver answered 503"
    assert endpoint.posts == ["http://a"] * 3


def test_a_4xx_is_rejected_at_once_and_an_old_delivery_gives_up():
    job = Job(delivery(), T0)
    assert post(Endpoint(404), job)[0] == Finished("rejected", 404, "receiver answered 404")
    assert job.delivery.attempts == 1
    old = Job(delivery(), T0 + timedelta(days=2))
    assert post(Endpoint(503, 503, 503), old, max_age_s=86400)[0] == Finished(
        "failed", 503, "gave up after 3 tries: receiver answered 503")


def test_a_long_retry_after_waits_in_the_queue_not_in_the_process():
    job = Job(delivery(), T0)
    outcome, waits = post(Endpoint(429, retry_after_s=30), job)
    assert outcome == Later(T0 + timedelta(seconds=30), "receiver answered 429") and waits == []
    assert job.delivery.attempts == 1


# --------------------------------------------------------------------------- the pipeline and the record


def test_the_first_stage_with_an_outcome_ends_the_pipeline_and_the_record_names_no_url():
    endpoint = Endpoint()
    pipeline = standard(directory, lambda *_: False, RateLimit(), "http://wf", endpoint, 3600)
    job, outcome = asyncio.run(pipeline.run(delivery("gone"), T0))
    assert isinstance(outcome, Finished) and outcome.status == "skipped" and endpoint.posts == []
    job, outcome = asyncio.run(pipeline.run(delivery(), T0))
    assert outcome == Finished("delivered", 200, None) and endpoint.posts == ["http://a"]
    assert isinstance(outcome, Finished)
    entry = record(job, outcome, T0 + timedelta(milliseconds=250))
    assert (entry.status, entry.attempts, entry.latency_ms, entry.title) == ("delivered", 1, 250.0, "a is hot")
    assert "http://" not in entry.model_dump_json()


def test_a_pipeline_without_a_final_stage_is_a_bug_not_a_silent_drop():
    try:
        asyncio.run(Pipeline([lambda job: None]).run(delivery(), T0))
    except RuntimeError as exc:
        assert "without an outcome" in str(exc)
    else:
        raise AssertionError("no outcome was accepted")


def test_retry_after_counts_from_the_answer_not_from_before_the_post():
    class Slow(Endpoint):
        async def __call__(self, url: str, body: dict[str, Any] | list[dict[str, Any]]) -> int:
            raise DeliveryError("receiver answered 503", retryable=True, status=503, retry_after_s=30,
                                retry_at=T0 + timedelta(seconds=34))  # answered 4 s after the job began

    outcome, waits = post(Slow(), Job(delivery(), T0))
    assert outcome == Later(T0 + timedelta(seconds=34), "receiver answered 503") and waits == []


def test_an_escalation_triggers_its_own_pagerduty_incident_and_a_resolution_reaches_all_of_them():
    esc = note("pd").model_copy(update={"escalation": True, "escalations": 2})
    [d] = directory().plan(esc)
    job = resolved(Job(d, T0))
    Mute(lambda *_: False)(job)
    Render("http://wf")(job)
    assert d.variant == 2 and isinstance(job.body, dict) and job.body["dedup_key"] == "whaleflux-g-e2"
    update = directory().plan(note("pd").model_copy(update={"escalations": 2}))
    assert [x.variant for x in update] == [0]  # an update of the incident: the first PagerDuty incident
    done = directory().plan(note("pd", "resolved").model_copy(update={"escalations": 2}))
    assert [x.variant for x in done] == [0, 1, 2] and len({x.id for x in done}) == 3
    keys = []
    for x in done:
        j = resolved(Job(x, T0))
        Mute(lambda *_: False)(j)
        Render("http://wf")(j)
        assert isinstance(j.body, dict) and j.body["event_action"] == "resolve"
        keys.append(j.body["dedup_key"])
    assert keys == ["whaleflux-g", "whaleflux-g-e1", "whaleflux-g-e2"]
