"""Generic webhook: Alertmanager's webhook payload (version 4), so existing receivers work unchanged.

Built as Alertmanager builds it: `groupLabels` are the route's `group_by`
labels, `commonLabels` / `commonAnnotations` the strict intersection of the
alerts', `groupKey` is `<route path>:<group labels>` (`{}/{category="cost"}:{...}`).
The incident's title is annotation `incident_title` of every alert (so it is
common to all of them, and templates can use `.CommonAnnotations.incident_title`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..dispatch.groups import Notification

ZERO_TIME = "0001-01-01T00:00:00Z"


def _ts(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def group_key(n: Notification) -> str:
    """Alertmanager's groupKey: the route's path, then the group labels."""
    return n.group_path + ":{" + ", ".join(f'{k}="{v}"' for k, v in sorted(n.group_labels.items())) + "}"


def alerts_of(n: Notification, external_url: str) -> list[dict[str, Any]]:
    """The alerts as Alertmanager's webhook (and its v2 API) writes them."""
    alerts = []
    for a in n.alerts:
        annotations = {**a.annotations, "incident_title": n.title} if n.title else a.annotations
        alerts.append({
            "status": a.status,
            "labels": a.labels,
            "annotations": annotations,
            "startsAt": _ts(a.starts_at),
            "endsAt": _ts(a.ends_at) if a.ends_at else ZERO_TIME,
            "generatorURL": f"{external_url}/v1/alerts",
            "fingerprint": a.fingerprint,
        })
    return alerts


def build(n: Notification, *, receiver: str, external_url: str, **_: object) -> dict[str, Any]:
    alerts = alerts_of(n, external_url)
    return {
        "receiver": receiver,
        "status": "firing" if any(a.status == "firing" for a in n.alerts) else "resolved",
        "alerts": alerts,
        "groupLabels": n.group_labels,
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key(n),
        "truncatedAlerts": 0,
    }


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    out = dict(maps[0])
    for m in maps[1:]:
        out = {k: v for k, v in out.items() if m.get(k) == v}
    return out
