"""Receivers within their platforms' limits (issue 16, deliver 8): Retry-After in both forms counted from the
answer, Slack mrkdwn escaped, Teams cards under Teams' size limit, compound durations in the rules file."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from whaleflux.alerting.config import parse_duration
from whaleflux.alerting.delivery.http import post_json
from whaleflux.alerting.delivery.model import RETRY_AFTER_MAX_S, DeliveryError, retry_after
from whaleflux.alerting.dispatch.groups import Notification, NotifiedAlert
from whaleflux.alerting.receivers import slack, teams

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_retry_after_reads_seconds_and_http_dates_counted_from_the_answer():
    assert retry_after("30", T0) == T0 + timedelta(seconds=30)
    assert retry_after("Tue, 01 Dec 2026 12:02:00 GMT", T0) == T0 + timedelta(minutes=2)
    assert retry_after("Tue, 01 Dec 2026 11:00:00 GMT", T0) == T0  # a date in the past: at once
    assert retry_after("86400", T0) == T0 + timedelta(seconds=RETRY_AFTER_MAX_S)
    assert retry_after(None, T0) is None and retry_after("soon", T0) is None


@pytest.mark.parametrize("header", ["7", "Tue, 01 Dec 2026 12:00:07 GMT"])
def test_post_json_counts_retry_after_from_when_the_answer_came(header: str):
    answered = T0 + timedelta(seconds=3)  # the POST took 3 s: the wait starts when it answered

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": header})

    async def go() -> DeliveryError:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(DeliveryError) as info:
                await post_json(client, "http://r", {}, lambda: answered)
            return info.value

    err = asyncio.run(go())
    expected = answered + timedelta(seconds=7) if header.isdigit() else T0 + timedelta(seconds=7)
    assert err.retryable and err.status == 429 and err.retry_at == expected


def _alert(i: int, summary: str, alertname: str = "Hot") -> NotifiedAlert:
    return NotifiedAlert(status="firing", fingerprint=f"f{i}", starts_at=T0, annotations={"summary": summary},
                         labels={"alertname": alertname, "severity": "critical"})


def _note(*alerts: NotifiedAlert, title: str = "") -> Notification:
    return Notification(id="g-1", receiver="r", group_key="g", group_labels={}, status="firing",
                        alerts=list(alerts), created_at=T0, title=title)


def test_slack_escapes_mrkdwn_in_alert_text():
    body = slack.build(_note(_alert(1, "temp <!channel> & <http://evil|click>", "A&B"), title="x <@U1>"),
                       external_url="http://wf")
    section = body["blocks"][1]["text"]["text"]
    assert "<!channel>" not in section and "&lt;!channel&gt; &amp; &lt;http://evil|click&gt;" in section
    assert "*A&amp;B*" in section
    assert body["text"] == "[CRITICAL] x &lt;@U1&gt;"
    assert body["blocks"][0]["text"]["text"] == "[CRITICAL] x <@U1>"  # plain_text is shown as is


def test_a_teams_card_stays_under_teams_size_limit_and_says_what_it_left_out():
    alerts = [_alert(i, "x" * 4000) for i in range(30)]
    body = teams.build(_note(*alerts, title="t" * 5000), external_url="http://wf")
    size = len(json.dumps(body, ensure_ascii=False).encode())
    assert size <= teams.MAX_BYTES
    card = body["attachments"][0]["content"]
    facts = card["body"][1]["facts"]
    assert 0 < len(facts) <= teams.MAX_FACTS
    assert all(len(f["value"]) <= teams.FACT_VALUE_MAX for f in facts)
    assert card["body"][-1]["text"] == f"{30 - len(facts)} more alert(s) not shown"
    small = teams.build(_note(_alert(1, "hot")), external_url="http://wf")["attachments"][0]["content"]["body"]
    assert len(small) == 2 and small[1]["facts"][0]["value"] == "hot"


@pytest.mark.parametrize(("text", "seconds"), [
    ("1h30m", 5400.0), ("2m30s", 150.0), ("1d12h", 129600.0), ("1w", 604800.0), ("500ms", 0.5), ("1m0s", 60.0),
    ("1.5h", 5400.0), (90, 90.0),
])
def test_compound_durations_are_accepted(text: str | int, seconds: float):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "30x", "1m1h", "-5s", "1h 30m"])
def test_bad_durations_are_refused(text: str):
    with pytest.raises(ValueError, match="1h30m"):
        parse_duration(text)
