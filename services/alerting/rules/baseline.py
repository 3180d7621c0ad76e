"""Exponentially weighted mean and variance with a warm-up: a GPU's own normal, learned online."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Ewma:
    half_life_s: float
    mean: float = 0.0
    var: float = 0.0
    n: int = 0
    last_t: float | None = None

    def zscore(self, value: float, floor: float = 1e-6) -> float:
        # A sensor that never moved has ~zero variance: floor it so one degree is not infinite sigmas.
        return (value - self.mean) / math.sqrt(max(self.var, floor))

    def update(self, value: float, t: float) -> None:
        if self.n == 0:
            self.mean, self.var = value, 0.0
        else:
            dt = max(t - (self.last_t if self.last_t is not None else t), 1e-3)
            # Weight by elapsed time, so an irregular sample rate does not change the memory.
            alpha = 1.0 - 0.5 ** (dt / self.half_life_s)
            diff = value - self.mean
            self.mean += alpha * diff
            self.var = (1 - alpha) * (self.var + alpha * diff * diff)
        self.n += 1
        self.last_t = t
