"""The physical range of each metric a threshold rule may compare: a limit outside it is a typo, not a policy.

A 0 °C overheating limit fires on every GPU and drains every node; a 500 % utilization limit never
fires. `limit_problem` says why a limit is refused; the loader reports it as `FILE:LINE: key: problem`
(config.py), and `resolve_threshold` (conditions.py) passes over a device-reported limit outside the
range for the next source, as a device that reports nothing. Metrics not listed here are not bounded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    unit: str

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:g}–{self.high:g} {self.unit}".rstrip()


GPU_TEMPERATURE = Range(30, 120, "°C")  # a GPU's slowdown lies near 85-95 °C, its shutdown near 90-105 °C
POWER = Range(0, 2000, "W")  # the largest boards draw about 1,200 W
PERCENT = Range(0, 100, "%")
RATIO = Range(0, 1, "")
POWER_RATIO = Range(0, 2, "")  # power over its limit: briefly above 1 under a power brake

METRIC_RANGES: dict[str, Range] = {
    "temperature_c": GPU_TEMPERATURE,
    "memory_temperature_c": GPU_TEMPERATURE,
    "slowdown_temperature_c": GPU_TEMPERATURE,
    "shutdown_temperature_c": GPU_TEMPERATURE,
    "thermal_margin_c": Range(0, 100, "°C"),
    "power_w": POWER,
    "power_limit_w": POWER,
    "utilization_gpu_pct": PERCENT,
    "utilization_memory_pct": PERCENT,
    "encoder_util_pct": PERCENT,
    "decoder_util_pct": PERCENT,
    "memory_used_ratio": RATIO,
    "tensor_active": RATIO,
    "gr_engine_active": RATIO,
    "dram_active": RATIO,
    "power_ratio": POWER_RATIO,
}


def limit_problem(metric: str, limit: float) -> str | None:
    """Why `limit` cannot be a threshold of `metric`; None when it can (or the metric is not bounded)."""
    bounds = METRIC_RANGES.get(metric)
    if bounds is None or limit in bounds:
        return None
    return f"{limit:g} is outside the physical range of {metric} ({bounds})"


def plausible(metric: str, limit: float) -> bool:
    """Whether `limit` lies within `metric`'s physical range (always, for a metric not bounded)."""
    return limit_problem(metric, limit) is None
