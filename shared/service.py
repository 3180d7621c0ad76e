"""An old import path, kept only for `Clock`, `system_clock` and `StateUnavailable`: import them from
`shared.clock` and `shared.runtime`. The `ServiceBase` class that lived here is gone: every service runs on
`shared.runtime.Runtime` (docs/architecture.md). Delete this module once nothing imports it."""

from __future__ import annotations

from .clock import Clock, system_clock
from .errors import StateUnavailable

__all__ = ["Clock", "StateUnavailable", "system_clock"]
