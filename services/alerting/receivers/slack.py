"""Slack incoming webhook: a header, one section per alert (at most 20), and a context line.

An alert's `description` annotation (a failed job's last log lines) follows
its summary in a code block.

Text from alerts is escaped for mrkdwn (`&`, `<`, `>`, as Slack asks), so a
summary cannot inject links or mentions; block texts are cut to Slack's limits
(header 150, section 3000 characters).
"""

from __future__ import annotations

from typing import Any

from ..dispatch.groups import Notification

MAX_ALERT_BLOCKS = 20
HEADER_MAX = 150
TEXT_MAX = 3000
FENCE = "`" * 3


def escape(text: str) -> str:
    """Slack's mrkdwn control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
_ICON = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def build(n: Notification, *, external_url: str, **_: object) -> dict[str, Any]:
    from . import headline, top_severity

    sev = top_severity(n)
    state = "RESOLVED" if n.status == "resolved" else sev.upper()
    title = f"[{state}] {headline(n)}"
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": _cut(title, HEADER_MAX)}}]
    for a in n.alerts[:MAX_ALERT_BLOCKS]:
        icon = ":white_check_mark:" if a.status == "resolved" else _ICON.get(a.labels.get("severity", ""), ":bell:")
        text = f"{icon} *{escape(a.labels.get('alertname', ''))}* {escape(a.annotations.get('summary', ''))}"
        if a.annotations.get("description"):
            block = escape(a.annotations["description"]).replace(FENCE, "` ` `")
            text += "\n" + FENCE + _cut(block, TEXT_MAX - len(text) - 8) + FENCE
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(text, TEXT_MAX)}})
    more = len(n.alerts) - MAX_ALERT_BLOCKS
    context = (f"{len(n.alerts)} alert(s)" + (f", {more} more not shown" if more > 0 else "")
               + f" | <{external_url}/v1/alerts|WhaleFlux>")
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": _cut(escape(title), TEXT_MAX), "blocks": blocks}
