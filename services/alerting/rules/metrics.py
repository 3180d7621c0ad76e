"""What a rule may measure: any GpuSample field, plus a few ratios derived from two of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from whaleflux.shared.events import GpuSample


def _ratio(num: str, den: str) -> Callable[[GpuSample], float | None]:
    def f(s: GpuSample) -> float | None:
        a, b = getattr(s, num), getattr(s, den)
        return a / b if a is not None and b else None

    return f


DERIVED_METRICS: dict[str, Callable[[GpuSample], float | None]] = {
    "memory_used_ratio": _ratio("memory_used_mib", "memory_total_mib"),
    "power_ratio": _ratio("power_w", "power_limit_w"),
}


def metric_value(sample: GpuSample, name: str) -> Any:
    """The metric's value in this sample, None where the device does not report it."""
    derived = DERIVED_METRICS.get(name)
    return derived(sample) if derived is not None else getattr(sample, name, None)
