"""Receivers: turn a notification into the body each service expects. Pure; the shell POSTs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dispatch.groups import Notification
from . import alertmanager, pagerduty, slack, teams, webhook

SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


def headline(n: Notification) -> str:
    """One line: the incident title when there is one, else the first alert's summary."""
    first = n.alerts[0].annotations.get("summary", n.alerts[0].labels.get("alertname", "")) if n.alerts else ""
    return n.title or first


def top_severity(n: Notification) -> str:
    levels = [a.labels.get("severity", "warning") for a in n.alerts if a.status == "firing"] or ["info"]
    return max(levels, key=lambda s: SEVERITY_ORDER.get(s, 1))


Body = dict[str, Any] | list[dict[str, Any]]  # Alertmanager's /api/v2/alerts takes a list

BUILDERS: dict[str, Callable[..., Body]] = {
    "webhook": webhook.build, "pagerduty": pagerduty.build, "slack": slack.build, "teams": teams.build,
    "alertmanager": alertmanager.build,
}
# Which notification kinds a receiver type wants: only PagerDuty has an acknowledge action.
WANTS_ACK = {"pagerduty"}
