"""Delivery bookkeeping: what is queued for a receiver, when to try again, how fast a receiver may be called.

The queue itself lives in Redis (the service shell); these are its pure rules.
Retries are kept in Redis rather than in-process (tenacity) so a receiver that
is down for minutes, or a restart of the service, loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from ..dispatch.groups import Notification

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 60.0


class Delivery(BaseModel):
    """One notification for one URL of one receiver."""

    id: str
    receiver: str
    receiver_type: str
    url_index: int = 0
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


def backoff_s(attempts: int, retry_after_s: float | None = None) -> float:
    """Wait before try number `attempts + 1`: doubling from 0.5 s up to a minute, or what the receiver asked."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.1), 15 * BACKOFF_MAX_S)
    return min(BACKOFF_FIRST_S * 2 ** max(attempts - 1, 0), BACKOFF_MAX_S)


@dataclass
class TokenBucket:
    """Per-receiver rate limit; time passed in. A delivery without a token waits, it is never dropped."""

    per_second: float
    burst: int
    tokens: float = -1.0
    last: float = 0.0

    def take(self, now: float) -> float:
        """0 if a call may go now (and spend a token), else seconds to wait."""
        if self.tokens < 0:
            self.tokens, self.last = float(self.burst), now
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_second)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.per_second
