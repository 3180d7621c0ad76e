"""Least-squares slope of recent points, for rate-of-change and time-to-limit rules."""

from __future__ import annotations

from collections.abc import Sequence


def slope_per_s(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope (value units per second) of the least-squares line through (t, value) points; None if flat in time."""
    n = len(points)
    if n < 2:
        return None
    mt = sum(p[0] for p in points) / n
    mv = sum(p[1] for p in points) / n
    stt = sum((p[0] - mt) ** 2 for p in points)
    if stt <= 0:
        return None
    return sum((p[0] - mt) * (p[1] - mv) for p in points) / stt


def seconds_to_limit(current: float, limit: float, slope: float) -> float | None:
    """Seconds until `current` growing at `slope` reaches `limit`; 0 if already there; None if not growing."""
    if current >= limit:
        return 0.0
    if slope <= 0:
        return None
    return (limit - current) / slope
