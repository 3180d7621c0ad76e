"""The injectable clock: every time a service decides by comes from one of these (tests pass their own)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The wall clock (UTC): the default `Clock`."""
    return datetime.now(UTC)
