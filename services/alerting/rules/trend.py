"""Least-squares slope of recent points, for rate-of-change and time-to-limit rules."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence


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


class Window:
    """The (t, value) points of the last `window` seconds, with running sums so the least-squares slope
    costs O(1) per sample rather than O(points) (10,000 GPUs at 1 Hz, several rules each).

    Times are kept relative to `base` so the sums stay small; the sums are rebuilt from the points
    whenever the window empties and once the base is a day old.
    """

    REBASE_S = 86400.0

    def __init__(self) -> None:
        self.points: deque[tuple[float, float]] = deque()
        self.base: float | None = None
        self._n = 0
        self._st = self._sv = self._stt = self._stv = 0.0

    def __len__(self) -> int:
        return len(self.points)

    def __bool__(self) -> bool:
        return bool(self.points)

    def __getitem__(self, i: int) -> tuple[float, float]:
        return self.points[i]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self.points)

    def clear(self) -> None:
        self.points.clear()
        self.base = None
        self._n = 0
        self._st = self._sv = self._stt = self._stv = 0.0

    def _add(self, t: float, v: float, sign: int) -> None:
        x = t - (self.base or 0.0)
        self._n += sign
        self._st += sign * x
        self._sv += sign * v
        self._stt += sign * x * x
        self._stv += sign * x * v

    def push(self, t: float, v: float, window: float) -> None:
        """Add a point; drop points older than `window` seconds before it."""
        if self.base is None or t - self.base > self.REBASE_S:
            self.base = t
            old = list(self.points)
            self.points.clear()
            self._n = 0
            self._st = self._sv = self._stt = self._stv = 0.0
            for p in old:
                self.points.append(p)
                self._add(*p, 1)
        self.points.append((t, v))
        self._add(t, v, 1)
        while self.points and self.points[0][0] < t - window:
            self._add(*self.points.popleft(), -1)
        if not self.points:
            self.clear()

    def slope(self) -> float | None:
        """Slope of the least-squares line through the points (units per second); None if flat in time."""
        n = self._n
        if n < 2:
            return None
        stt = self._stt - self._st * self._st / n
        if stt <= 1e-9 * max(1.0, self._stt):
            return None
        return (self._stv - self._st * self._sv / n) / stt
