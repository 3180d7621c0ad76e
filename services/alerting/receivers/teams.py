"""Microsoft Teams workflow webhook ("Post to a channel when a webhook request is received"): an Adaptive Card.

Teams refuses messages over about 28 KB, so the card is kept under MAX_BYTES:
each fact's value is cut to FACT_VALUE_MAX characters (an alert's
`description`, a failed job's last log lines, to DESCRIPTION_MAX below it),
facts are added while the message fits, and a last line says how many alerts
were left out.
"""

from __future__ import annotations

import json
from typing import Any

from ..dispatch.groups import Notification

MAX_FACTS = 20
MAX_BYTES = 24_000  # Teams' limit is about 28 KB: room for the envelope Teams adds
FACT_VALUE_MAX = 400
DESCRIPTION_MAX = 1500
TITLE_MAX = 300


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _size(body: dict[str, Any]) -> int:
    return len(json.dumps(body, ensure_ascii=False).encode())


def build(n: Notification, *, external_url: str, **_: object) -> dict[str, Any]:
    from . import headline, top_severity

    sev = top_severity(n)
    state = "RESOLVED" if n.status == "resolved" else sev.upper()
    color = {"critical": "Attention", "warning": "Warning"}.get(sev, "Default") if n.status != "resolved" else "Good"
    facts: list[dict[str, str]] = []
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": _cut(f"[{state}] {headline(n)}", TITLE_MAX), "weight": "Bolder",
             "size": "Medium", "color": color, "wrap": True},
            {"type": "FactSet", "facts": facts},
        ],
        "actions": [{"type": "Action.OpenUrl", "title": "Open in WhaleFlux", "url": f"{external_url}/v1/alerts"}],
    }
    body = {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card},
        ],
    }
    room = MAX_BYTES - _size(body) - 200  # the "more not shown" line
    for a in n.alerts[:MAX_FACTS]:
        value = _cut(a.annotations.get("summary", ""), FACT_VALUE_MAX)
        if a.annotations.get("description"):
            value += "\n\n" + _cut(a.annotations["description"], DESCRIPTION_MAX)
        fact = {"title": _cut(f"{a.labels.get('alertname', '')} ({a.status})", 100), "value": value}
        room -= _size(fact) + 1
        if room < 0:
            break
        facts.append(fact)
    if len(facts) < len(n.alerts):
        card["body"].append({"type": "TextBlock", "text": f"{len(n.alerts) - len(facts)} more alert(s) not shown",
                             "isSubtle": True, "wrap": True})
    return body
