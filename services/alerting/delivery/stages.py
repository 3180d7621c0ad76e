"""The stages of delivery, each with one job: resolve receiver, inhibit and silence, rate limit, render, post.
No I/O: time is passed in, and the post stage calls the `send` it is given (the service's `http.py`).

A stage takes the `Job` (the delivery and what earlier stages found) and
returns None to go on, or an outcome: `Finished` (it goes in the notification
log: delivered, rejected, failed, skipped) or `Later` (it stays queued until
`at`). `record` turns a finished job into its log entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from ..dispatch.groups import Notification
from ..receivers import BUILDERS, Body
from .directory import Directory, Receiver
from .model import Delivery, DeliveryError, LogEntry

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 60.0
# Tries made at once (waiting 0.5 s, then 1 s); after that the delivery goes back in the queue, so a
# receiver that is down for minutes, or a restart of the service, loses nothing.
TRIES_AT_ONCE = 3
LONGEST_WAIT_AT_ONCE_S = 2.0


@dataclass
class Job:
    delivery: Delivery
    now: datetime
    receiver: Receiver | None = None
    notification: Notification | None = None  # what is still to say once muted alerts are left out
    body: Body | None = None


@dataclass(frozen=True)
class Finished:
    status: Literal["delivered", "rejected", "failed", "skipped"]
    http_status: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Later:
    at: datetime
    error: str | None = None  # None: not tried (rate limit), so nothing about the delivery changed


Outcome = Finished | Later


def backoff_s(attempts: int, retry_after_s: float | None = None) -> float:
    """Wait before try number `attempts + 1`: doubling from 0.5 s up to a minute, or what the receiver asked."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.1), 15 * BACKOFF_MAX_S)
    return min(BACKOFF_FIRST_S * 2.0 ** max(attempts - 1, 0), BACKOFF_MAX_S)


class ResolveReceiver:
    """The receiver by name, with its URL for this delivery and (PagerDuty) its routing key."""

    def __init__(self, directory: Callable[[], Directory]) -> None:
        self.directory = directory  # the current one: it changes when the rules file is reloaded

    def __call__(self, job: Job) -> Outcome | None:
        d = job.delivery
        recv = self.directory().get(d.receiver)
        if recv is None:
            return Finished("skipped", None, f"no receiver named {d.receiver!r} in the rules file")
        if d.url_index >= len(recv.urls):
            return Finished("skipped", None, "no URL configured for this receiver")
        if recv.type == "pagerduty" and not recv.routing_key:
            return Finished("skipped", None, f"routing key not set ({recv.config.routing_key_env})")
        job.receiver = recv
        return None


Muted = Callable[[dict[str, str], str, datetime], bool]  # (labels, fingerprint, now) -> silenced or inhibited


class Mute:
    """Leave out the firing alerts silenced or inhibited since the notification was queued (a retry an hour on)."""

    def __init__(self, muted: Muted) -> None:
        self.muted = muted

    def __call__(self, job: Job) -> Outcome | None:
        n = job.delivery.notification
        job.notification = n
        if n.status != "firing":
            return None
        keep = [a for a in n.alerts if a.status != "firing" or not self.muted(a.labels, a.fingerprint, job.now)]
        if len(keep) == len(n.alerts):
            return None
        if not keep:
            return Finished("skipped", None, "silenced or inhibited since it was queued")
        status = "firing" if any(a.status == "firing" for a in keep) else "resolved"
        job.notification = n.model_copy(update={"alerts": keep, "status": status})
        return None


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


class RateLimit:
    """A receiver's `rate_limit`: over it, the delivery waits for a token."""

    def __init__(self) -> None:
        self.buckets: dict[str, TokenBucket] = {}

    def reset(self) -> None:
        """The rules changed (limits may have): start every bucket full."""
        self.buckets.clear()

    def __call__(self, job: Job) -> Outcome | None:
        recv = _receiver(job)
        limit = recv.config.rate_limit
        if limit is None:
            return None
        bucket = self.buckets.setdefault(recv.name, TokenBucket(limit.per_second, limit.burst))
        wait = bucket.take(job.now.timestamp())
        return Later(job.now + timedelta(seconds=wait)) if wait > 0 else None


class Render:
    """The body the receiver's service expects (`receivers/`)."""

    def __init__(self, external_url: str) -> None:
        self.external_url = external_url

    def __call__(self, job: Job) -> Outcome | None:
        recv = _receiver(job)
        extra: dict[str, Any] = (
            {"routing_key": recv.routing_key, "variant": job.delivery.variant} if recv.type == "pagerduty" else {})
        n = job.notification or job.delivery.notification
        job.body = BUILDERS[recv.type](n, receiver=recv.name, external_url=self.external_url, **extra)
        return None


Send = Callable[[str, Body], Awaitable[int]]  # (url, body) -> HTTP status, or DeliveryError


class Post:
    """POST the body: a few tries at once (tenacity), then back in the queue with back-off until `max_age_s`."""

    def __init__(self, send: Send, max_age_s: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 tries: int = TRIES_AT_ONCE) -> None:
        self.send, self.max_age_s, self.sleep, self.tries = send, max_age_s, sleep, tries

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.tries) | _WaitsTooLong(), wait=_wait,
            retry=retry_if_exception(lambda e: isinstance(e, DeliveryError) and e.retryable),
            sleep=self.sleep, reraise=True)

    async def __call__(self, job: Job) -> Outcome:
        d, recv = job.delivery, _receiver(job)
        if job.body is None:
            raise RuntimeError("post before render: the pipeline is out of order")
        status = 0
        try:
            async for attempt in self._retrying():
                with attempt:
                    d.attempts += 1
                    status = await self.send(recv.urls[d.url_index], job.body)
        except DeliveryError as exc:
            if not exc.retryable:
                return Finished("rejected", exc.status, exc.reason)
            if (job.now - d.created_at).total_seconds() > self.max_age_s:
                return Finished("failed", exc.status, f"gave up after {d.attempts} tries: {exc.reason}")
            d.last_error = exc.reason
            # Retry-After counts from the receiver's answer (retry_at), not from before the POST (job.now).
            at = exc.retry_at or job.now + timedelta(seconds=backoff_s(d.attempts, exc.retry_after_s))
            return Later(at, exc.reason)
        return Finished("delivered", status, None)


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome is not None else None
    return backoff_s(state.attempt_number, exc.retry_after_s if isinstance(exc, DeliveryError) else None)


class _WaitsTooLong(stop_base):
    """A receiver that asks for a long wait (Retry-After) waits in the queue, not here."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        return retry_state.upcoming_sleep > LONGEST_WAIT_AT_ONCE_S


def record(job: Job, outcome: Finished, now: datetime) -> LogEntry:
    """The notification log's row for a finished delivery."""
    d = job.delivery
    n = d.notification
    return LogEntry(
        delivery_id=d.id, notification_id=n.id, receiver=d.receiver, receiver_type=d.receiver_type,
        url_index=d.url_index, status=outcome.status, notification_status=n.status, group_key=n.group_key,
        title=n.title or (n.alerts[0].annotations.get("summary", "") if n.alerts else ""), alerts=len(n.alerts),
        attempts=d.attempts, http_status=outcome.http_status, reason=outcome.reason, created_at=d.created_at,
        finished_at=now, latency_ms=round((now - d.created_at).total_seconds() * 1000, 2),
    )


def _receiver(job: Job) -> Receiver:
    if job.receiver is None:
        raise RuntimeError("receiver not resolved: the pipeline is out of order")
    return job.receiver
