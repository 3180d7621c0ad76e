"""What a consumer's handler is and may raise, and the delivery metrics every bus counts.

A handler gets one event (`Handler`), or every valid event of a fetch when it is
marked `@batch_handler` (`BatchHandler`). `Reject`: the event can never be
processed (dead-lettered); `Retry`: transient trouble (redelivered later).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from .events import Envelope, EventData

Handler = Callable[[Envelope, EventData], Awaitable[None]]
# Gets the valid events of one fetch, in stream order; returns one outcome per event
# (None: handled; Reject, Retry or another exception: settled like a raising handler),
# or None when all were handled.
BatchHandler = Callable[[list[tuple[Envelope, EventData]]], Awaitable["list[Exception | None] | None"]]
F = TypeVar("F", bound=Callable[..., object])


class Reject(Exception):
    """Raised by a handler for an event that is well-formed but can never be processed."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Retry(Exception):
    """Raised by a handler for transient trouble: redeliver later, dead-letter when out of tries."""

    def __init__(self, reason: str, delay_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


def batch_handler(fn: F) -> F:
    """Mark a handler as a BatchHandler: `Bus.start_consumer` then runs its consumer in batch mode."""
    fn.whaleflux_batch = True  # type: ignore[attr-defined]
    return fn


def is_batch_handler(handler: object) -> bool:
    return bool(getattr(handler, "whaleflux_batch", False))


@dataclass
class BusMetrics:
    handled: Counter
    deadlettered: Counter
    errors: Counter
    duplicates: Counter
    latency: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BusMetrics:
        return cls(
            handled=Counter("whaleflux_events_handled", "Events handled", ["consumer", "type"], registry=registry),
            deadlettered=Counter(
                "whaleflux_events_deadlettered",
                "Events sent to deadletter.<subject>",
                ["consumer", "stage"],
                registry=registry,
            ),
            errors=Counter("whaleflux_handler_errors", "Handler failures (retried)", ["consumer"], registry=registry),
            duplicates=Counter("whaleflux_events_duplicate", "Redelivered events skipped", ["consumer"],
                               registry=registry),
            latency=Histogram(
                "whaleflux_event_handle_seconds",
                "Time to handle one event",
                ["consumer"],
                registry=registry,
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            ),
        )
