"""Slack incoming webhook: a header, one section per alert (at most 20), and a context line."""

from __future__ import annotations

from typing import Any

from ..dispatch.groups import Notification

MAX_ALERT_BLOCKS = 20
_ICON = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def build(n: Notification, *, external_url: str, **_: object) -> dict[str, Any]:
    from . import headline, top_severity

    sev = top_severity(n)
    state = "RESOLVED" if n.status == "resolved" else sev.upper()
    title = f"[{state}] {headline(n)}"
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title[:150]}}]
    for a in n.alerts[:MAX_ALERT_BLOCKS]:
        icon = ":white_check_mark:" if a.status == "resolved" else _ICON.get(a.labels.get("severity", ""), ":bell:")
        text = f"{icon} *{a.labels.get('alertname', '')}* {a.annotations.get('summary', '')}"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}})
    more = len(n.alerts) - MAX_ALERT_BLOCKS
    context = (f"{len(n.alerts)} alert(s)" + (f", {more} more not shown" if more > 0 else "")
               + f" | <{external_url}/v1/alerts|WhaleFlux>")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": title[:3000], "blocks": blocks}
