"""Microsoft Teams workflow webhook ("Post to a channel when a webhook request is received"): an Adaptive Card."""

from __future__ import annotations

from typing import Any

from ..dispatch.groups import Notification

MAX_FACTS = 20


def build(n: Notification, *, external_url: str, **_: object) -> dict[str, Any]:
    from . import headline, top_severity

    sev = top_severity(n)
    state = "RESOLVED" if n.status == "resolved" else sev.upper()
    color = {"critical": "Attention", "warning": "Warning"}.get(sev, "Default") if n.status != "resolved" else "Good"
    facts = [
        {"title": f"{a.labels.get('alertname', '')} ({a.status})", "value": a.annotations.get("summary", "")}
        for a in n.alerts[:MAX_FACTS]
    ]
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {"type": "TextBlock", "text": f"[{state}] {headline(n)}", "weight": "Bolder", "size": "Medium",
             "color": color, "wrap": True},
            {"type": "FactSet", "facts": facts},
        ],
        "actions": [{"type": "Action.OpenUrl", "title": "Open in WhaleFlux", "url": f"{external_url}/v1/alerts"}],
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card},
        ],
    }
