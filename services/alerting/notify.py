"""Webhook receiver: POST alerts in Alertmanager's webhook format (version 4).

Many receivers already understand that payload (see shared data samples), so
the generic webhook speaks it. A 5xx, 429 or connection error is worth retrying;
any other 4xx is not.
"""

from __future__ import annotations

from datetime import datetime

import httpx

from whaleflux.shared.events import AlertRaised, AlertResolved

ZERO_TIME = "0001-01-01T00:00:00Z"


class DeliveryError(Exception):
    """A POST failed; `retryable` says whether trying again can help (5xx, 429, no connection)."""

    def __init__(self, reason: str, retryable: bool, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after_s: float | None = None


def _ts(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def alertmanager_payload(alert: AlertRaised | AlertResolved, external_url: str, receiver: str = "webhook") -> dict:
    firing = isinstance(alert, AlertRaised)
    status = "firing" if firing else "resolved"
    labels = {"alertname": alert.rule, **alert.labels}
    if firing:
        labels.setdefault("severity", alert.severity)
    annotations = {"summary": alert.summary, **(alert.annotations if firing else {})}
    group_labels = {k: labels[k] for k in ("alertname", "Hostname", "gpu") if k in labels}
    return {
        "receiver": receiver,
        "status": status,
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": annotations,
                "startsAt": _ts(alert.starts_at),
                "endsAt": ZERO_TIME if firing else _ts(alert.ends_at),
                "generatorURL": f"{external_url}/v1/alerts",
                "fingerprint": alert.fingerprint,
            }
        ],
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": external_url,
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}",
        "truncatedAlerts": 0,
    }


async def post_webhook(client: httpx.AsyncClient, url: str, payload: dict) -> None:
    try:
        resp = await client.post(url, json=payload, timeout=5.0)
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{type(exc).__name__} posting to webhook", retryable=True) from None
    if resp.status_code >= 500 or resp.status_code == 429:
        raise DeliveryError(f"webhook answered {resp.status_code}", retryable=True)
    if resp.status_code >= 400:
        raise DeliveryError(f"webhook answered {resp.status_code}", retryable=False)
