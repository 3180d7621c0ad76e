"""Exponentially weighted mean and variance with a warm-up: a GPU's own normal, learned online."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Ewma:
    """Exponentially decayed mean and variance; weights decay with time (half-life), not with sample count,
    so one series at 1 Hz and a population of many GPUs reporting each second are handled alike."""

    half_life_s: float
    mean: float = 0.0
    var: float = 0.0
    n: int = 0
    weight: float = 0.0
    last_t: float | None = None

    def zscore(self, value: float, floor: float = 1e-6) -> float:
        # A sensor that never moved has ~zero variance: floor it so one degree is not infinite sigmas.
        return (value - self.mean) / math.sqrt(max(self.var, floor))

    def update(self, value: float, t: float) -> None:
        if self.n == 0:
            self.mean, self.var, self.weight = value, 0.0, 1.0
        else:
            dt = max(t - (self.last_t if self.last_t is not None else t), 0.0)
            # Older samples weigh 0.5 ** (age / half_life); the newest weighs 1. At one sample per
            # second this is the usual EWMA; early on (little weight yet) it learns fast instead of
            # clinging to the first value.
            self.weight = self.weight * 0.5 ** (dt / self.half_life_s) + 1.0
            alpha = 1.0 / self.weight
            diff = value - self.mean
            self.mean += alpha * diff
            self.var = (1 - alpha) * (self.var + alpha * diff * diff)
        self.n += 1
        self.last_t = t if self.last_t is None else max(self.last_t, t)
