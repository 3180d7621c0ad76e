"""Exponentially weighted mean and variance with a warm-up: a GPU's own normal, learned online."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from whaleflux.shared.events import GpuSample

from ..config import BaselineRule
from .metrics import metric_value
from .series import Cond, Series, Verdict


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


class Baselines:
    """The learned normals of baseline rules, one per (rule, *`by` values)."""

    def __init__(self) -> None:
        self.ewmas: dict[tuple[str, ...], Ewma] = {}

    def forget(self, rule_names: set[str]) -> None:
        """Drop what these (changed or removed) rules learned."""
        for key in [k for k in self.ewmas if k[0] in rule_names]:
            del self.ewmas[key]

    def verdict(self, rule: BaselineRule, s: Series, sample: GpuSample, t: float, cls: str,
                node: str, pool: str | None) -> Verdict | None:
        """Judge a sample against its baseline, then learn from it unless it is an anomaly."""
        raw = metric_value(sample, rule.metric)
        if raw is None:
            return None
        value = float(raw)
        if s.workload_class != cls:
            s.workload_class, s.class_since = cls, t
        parts = {"gpu": sample.uuid, "model": sample.model, "workload_class": cls, "node": node, "pool": pool or ""}
        key = (rule.name, *(parts[b] for b in rule.by))
        e = self.ewmas.get(key)
        if e is None:
            e = self.ewmas[key] = Ewma(rule.half_life)
        extra: dict[str, Any] = {"mean": e.mean, "sigmas": 0.0, "workload_class": cls, "samples": e.n,
                                 "delta": value - e.mean, "spread": math.sqrt(max(e.var, rule.min_spread ** 2))}
        if t - s.class_since < rule.settle:
            return s.hold(), value, extra  # heating or cooling toward its new load: neither judged nor learned
        cond = s.hold()
        if e.n >= rule.warm_up:
            z = e.zscore(value, rule.min_spread ** 2)
            extra["sigmas"] = z
            if z >= rule.sigmas and value - e.mean >= rule.min_delta:
                cond = Cond.FIRE
            elif z < rule.resolve_sigmas:
                cond = Cond.CLEAR
        if cond is not Cond.FIRE and not s.firing:
            e.update(value, t)  # an anomaly does not become the normal (nor widen the population's spread)
        return cond, value, extra
