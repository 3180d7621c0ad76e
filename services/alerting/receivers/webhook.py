"""Generic webhook: Alertmanager's webhook payload (version 4), so existing receivers work unchanged."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..dispatch.groups import Notification

ZERO_TIME = "0001-01-01T00:00:00Z"


def _ts(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def build(n: Notification, *, receiver: str, external_url: str, **_: object) -> dict[str, Any]:
    alerts = []
    for a in n.alerts:
        alerts.append({
            "status": a.status,
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": _ts(a.starts_at),
            "endsAt": _ts(a.ends_at) if a.ends_at else ZERO_TIME,
            "generatorURL": f"{external_url}/v1/alerts",
            "fingerprint": a.fingerprint,
        })
    common_labels = _common([a.labels for a in n.alerts])
    common_ann = _common([a.annotations for a in n.alerts])
    if n.title:
        common_ann = {**common_ann, "incident": n.title}
    return {
        "receiver": receiver,
        "status": "firing" if any(a.status == "firing" for a in n.alerts) else "resolved",
        "alerts": alerts,
        "groupLabels": n.group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": common_ann,
        "externalURL": external_url,
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(n.group_labels.items())) + "}",
        "truncatedAlerts": 0,
    }


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    out = dict(maps[0])
    for m in maps[1:]:
        out = {k: v for k, v in out.items() if m.get(k) == v}
    return out
