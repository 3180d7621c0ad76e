"""PagerDuty Events API v2: trigger, acknowledge, resolve one PagerDuty incident per group.

`dedup_key` is the group key, stable for the life of the WhaleFlux incident, so
a re-sent trigger updates the open PagerDuty incident instead of paging again.
An escalation (a new critical GPU inside the incident) must page, so it
triggers under `<key>-e<n>`; resolving and acknowledging reach every key
(`variant`, one delivery each: `delivery/directory.py`).
"""

from __future__ import annotations

from typing import Any

from ..dispatch.groups import Notification

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
DESCRIPTION_MAX = 2000  # per alert, 10 alerts at most: far under the Events API's 512 KB
_PD_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def dedup_key(group_key: str, variant: int = 0) -> str:
    return f"whaleflux-{group_key}" + (f"-e{variant}" if variant else "")


def build(n: Notification, *, routing_key: str, external_url: str, variant: int = 0, **_: object) -> dict[str, Any]:
    from . import headline, top_severity

    action = {"firing": "trigger", "resolved": "resolve", "acknowledged": "acknowledge"}[n.status]
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": action,
                            "dedup_key": dedup_key(n.group_key, variant)}
    if action != "trigger":
        return body
    firing = [a for a in n.alerts if a.status == "firing"]
    first = firing[0] if firing else n.alerts[0]
    body["payload"] = {
        "summary": headline(n)[:1024],
        "source": first.labels.get("Hostname") or first.labels.get("cluster") or "whaleflux",
        "severity": _PD_SEVERITY.get(top_severity(n), "warning"),
        "timestamp": first.starts_at.isoformat(),
        "component": first.labels.get("modelName", "gpu"),
        "group": first.labels.get("pool") or first.labels.get("cluster", ""),
        "class": first.labels.get("alertname", ""),
        "custom_details": {
            "firing": [a.annotations.get("summary", "") for a in firing][:50],
            # A failed job's last log lines (any alert's description), by summary, bounded.
            "details": {a.annotations.get("summary", "")[:200]: a.annotations["description"][:DESCRIPTION_MAX]
                        for a in firing[:10] if a.annotations.get("description")},
            "group": n.group_labels,
            "alerts": len(firing),
        },
    }
    body["client"] = "WhaleFlux"
    body["client_url"] = f"{external_url}/v1/alerts"
    return body
