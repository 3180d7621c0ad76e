"""What is queued for a receiver, what the notification log keeps, and how a POST fails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Literal

from pydantic import BaseModel, Field

from ..dispatch.groups import Notification


class Delivery(BaseModel):
    """One notification for one URL of one receiver."""

    id: str
    receiver: str
    receiver_type: str
    url_index: int = 0
    variant: int = Field(0, description="PagerDuty: which of the group's incidents (0, then one per escalation)")
    notification: Notification
    created_at: datetime
    attempts: int = 0
    last_error: str | None = None


class LogEntry(BaseModel):
    """A row of the notification log; never holds a URL or a key."""

    delivery_id: str
    notification_id: str
    receiver: str
    receiver_type: str
    url_index: int
    status: Literal["delivered", "rejected", "failed", "skipped"]
    notification_status: str
    group_key: str
    title: str
    alerts: int
    attempts: int
    http_status: int | None = None
    reason: str | None = None
    created_at: datetime
    finished_at: datetime
    latency_ms: float = Field(description="from the notification being created to this outcome")


class DeliveryError(Exception):
    """A POST failed; `retryable` says whether trying again can help (5xx, 429, no connection)."""

    def __init__(self, reason: str, retryable: bool, status: int | None = None,
                 retry_after_s: float | None = None, retry_at: datetime | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s  # what the receiver asked, counted from its answer
        self.retry_at = retry_at  # the same as a time: when the answer came plus Retry-After


# A receiver asking for more than this is asked again after this long.
RETRY_AFTER_MAX_S = 900.0


def retry_after(value: str | None, received_at: datetime) -> datetime | None:
    """When a `Retry-After` header (RFC 9110: delay-seconds or an HTTP-date) allows the next try, counted from
    when the answer came; None when absent or unreadable. Capped at RETRY_AFTER_MAX_S."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        at = received_at + timedelta(seconds=int(value))
    else:
        try:
            at = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
    return min(max(at, received_at), received_at + timedelta(seconds=RETRY_AFTER_MAX_S))
