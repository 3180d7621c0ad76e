"""A real Alertmanager as a receiver: the group's alerts POSTed to its `/api/v2/alerts` (a list of
`postableAlert`, Alertmanager's OpenAPI spec), so its routing, silences, inhibition and receivers keep
working with WhaleFlux as the fast source. Pure.

Alertmanager resolves an alert by itself when its `endsAt` passes (for an alert
sent without one: after its `resolve_timeout`), so a firing alert is sent with
`endsAt` = now + FIRING_HOLD_S; every notification of the group (changes, and
repeats every `repeat_interval`, which should be shorter) extends it, and a
resolution sends the alert's real end.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..dispatch.groups import Notification
from .webhook import alerts_of

FIRING_HOLD_S = 24 * 3600.0
API_PATH = "/api/v2/alerts"


def url_for(base: str) -> str:
    """The alerts endpoint of an Alertmanager given by its base URL (or by the endpoint itself)."""
    base = base.rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def _ts(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def build(n: Notification, *, external_url: str, **_: object) -> list[dict[str, Any]]:
    hold = _ts(n.created_at + timedelta(seconds=FIRING_HOLD_S))
    out = []
    for a, raw in zip(n.alerts, alerts_of(n, external_url), strict=True):
        out.append({
            "labels": raw["labels"],
            "annotations": raw["annotations"],
            "startsAt": raw["startsAt"],
            "endsAt": _ts(a.ends_at) if a.ends_at is not None else hold,
            "generatorURL": raw["generatorURL"],
        })
    return out
