"""The condition of each GPU rule kind on one sample: FIRE, HOLD or CLEAR, with the value and summary fields.

Pure and time passed in (`t`, the sample's time in seconds). Baselines are in
`baseline.py`; `for` durations, labels and transitions are the engine's part.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from whaleflux.shared.catalog import GpuModel
from whaleflux.shared.events import GpuSample

from ..config import CounterRule, FlagRule, RateRule, Threshold, ThresholdRule, ThrottleRule, TrendRule, XidRule
from .metrics import metric_value
from .ranges import plausible
from .series import Cond, Series, Verdict
from .trend import Window, seconds_to_limit, slope_per_s

_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt,
                                                   "<=": operator.le}
STEADY_HALF_LIFE_S = 5.0

SampleRule = ThresholdRule | RateRule | TrendRule | CounterRule | FlagRule | XidRule | ThrottleRule


def resolve_threshold(t: Threshold, sample: GpuSample, model: GpuModel | None, metric: str = "") -> float | None:
    """The limit for this GPU: device-reported first, then per-model, then the catalogue, then a constant. A
    device-reported limit outside `metric`'s physical range (a sensor reading 0 °C) counts as none reported."""
    limit = None
    if t.device is not None:
        limit = getattr(sample, t.device, None)
        if limit is not None and not plausible(metric, float(limit) + t.offset):
            limit = None
    if limit is None and model is not None and model.key in t.per_model:
        limit = t.per_model[model.key]
    if limit is None and model is not None and t.model is not None:
        limit = getattr(model, t.model, None)
    if limit is None:
        limit = t.value
    return None if limit is None else float(limit) + t.offset


def evaluate(rule: SampleRule, s: Series, sample: GpuSample, model: GpuModel | None, t: float) -> Verdict | None:
    """The verdict of one rule on one sample; None when it cannot be evaluated (the metric is not reported)."""
    if isinstance(rule, XidRule):
        return _xid(rule, s, sample, t)
    if isinstance(rule, ThrottleRule):
        hits = [r for r in sample.throttle_reasons if r in rule.reasons]
        return (Cond.FIRE if hits else Cond.CLEAR), float(len(hits)), {"reasons": ", ".join(hits)}
    raw = metric_value(sample, rule.metric)
    if raw is None:
        return None
    if isinstance(rule, FlagRule):
        return (Cond.FIRE if raw else Cond.CLEAR), float(bool(raw)), {}
    value = float(raw)
    if isinstance(rule, ThresholdRule):
        return _threshold(rule, s, sample, value, resolve_threshold(rule.threshold, sample, model, rule.metric), t)
    if isinstance(rule, RateRule):
        return _rate(rule, s, sample, value, t)
    if isinstance(rule, TrendRule):
        return _trend(rule, s, sample, value, t)
    return _counter(rule, s, value, t)


def _threshold(rule: ThresholdRule, s: Series, sample: GpuSample, value: float, limit: float | None,
               t: float) -> Verdict | None:
    if limit is None:
        return None
    op = _OPS[rule.op]
    back = -rule.hysteresis if rule.op in (">", ">=") else rule.hysteresis
    if op(value, limit):
        cond = Cond.FIRE
        s.safe_since = None
    elif op(value, limit + back):
        cond = Cond.HOLD  # inside the hysteresis band
        s.safe_since = None
    else:
        cond = _safe(rule, s, sample, t)
    return cond, value, {"threshold": limit}


def _safe(rule: ThresholdRule, s: Series, sample: GpuSample, t: float) -> Cond:
    """Back on the safe side: clear, unless the rule wants that shown under load (a drained, idle GPU
    cools whatever its fault) and the GPU is not loaded: then clear only after `resolve_hold` there."""
    if rule.resolve_under_load is None or not s.firing:
        return Cond.CLEAR
    if s.safe_since is None:
        s.safe_since = t
    if sample.utilization_gpu_pct >= rule.resolve_under_load or t - s.safe_since >= rule.resolve_hold:
        s.safe_since = None
        return Cond.CLEAR
    return Cond.HOLD


def _slope(rule: RateRule | TrendRule, s: Series) -> float | None:
    """The window's slope once it holds enough samples over at least half its span."""
    slope = s.points.slope() if len(s.points) >= rule.min_samples else None
    if slope is None or s.points[-1][0] - s.points[0][0] < rule.window / 2:
        return None
    return slope


def _rate(rule: RateRule, s: Series, sample: GpuSample, value: float, t: float) -> Verdict:
    s.points.push(t, value, rule.window)
    if rule.steady_metric is not None:
        _track_steady(s, metric_value(sample, rule.steady_metric), rule.steady_tolerance, t)
    slope = _slope(rule, s)
    if slope is None:
        return s.hold(), value, {}
    per_min = slope * 60
    if rule.steady_metric is not None and not _steady(s, rule, t):
        return s.hold(), value, {"per_minute": per_min}
    want = rule.per_minute
    hit = per_min >= want if want >= 0 else per_min <= want
    half = per_min >= want / 2 if want >= 0 else per_min <= want / 2
    return (Cond.FIRE if hit else Cond.HOLD if half else Cond.CLEAR), value, {"per_minute": per_min}


def _trend(rule: TrendRule, s: Series, sample: GpuSample, value: float, t: float) -> Verdict | None:
    # The trend of what runs now: when the processes on the GPU change (a job ends, another
    # starts), the memory they hold steps; start the window afresh.
    owner = tuple(sorted((p.job_id or "", p.pid) for p in sample.processes))
    if owner != s.owner:
        s.owner = owner
        s.points.clear()
    s.points.push(t, value, rule.window)
    slope = _slope(rule, s)
    if slope is None:
        return s.hold(), value, {}
    raw_limit = metric_value(sample, rule.limit_metric)
    if raw_limit is None:
        return None
    limit = float(raw_limit)
    # Project from the recent slope (the window's second half), not the whole window: a leak that began
    # inside the window would be averaged with the flat samples before it (slower, and more time left
    # than there is). The whole window's slope still has to be growing for the projection to be made.
    halves = _half_slopes(s.points)
    recent = halves[1] if halves is not None and halves[1] is not None and halves[1] > 0 else slope
    eta = seconds_to_limit(value, limit, recent) if slope > rule.min_slope_per_s else None
    sustained = halves is not None and all(h is not None and h > rule.min_slope_per_s for h in halves)
    if eta is not None and eta <= rule.within and (not rule.sustained or sustained):
        cond = Cond.FIRE
    elif eta is not None and eta <= 2 * rule.within:
        cond = Cond.HOLD
    else:
        cond = Cond.CLEAR
    return cond, value, {"limit": limit, "eta_s": eta or 0.0, "eta_min": (eta or 0.0) / 60, "slope_per_s": recent,
                         "window_slope_per_s": slope}


def _counter(rule: CounterRule, s: Series, value: float, t: float) -> Verdict:
    if s.points and value < s.points[-1][1]:
        s.points.clear()  # counter reset (driver reload): start counting again
    grew = bool(s.points) and value > s.points[-1][1]
    s.points.push(t, value, rule.window)
    increase = s.points[-1][1] - s.points[0][1]
    # Only a sample that grew the counter (re)starts the alert; clear_after runs from the last growth.
    if grew and increase >= rule.increase:
        s.last_hit = t
        return Cond.FIRE, value, {"increase": increase}
    return _cleared_after(s, t, rule.clear_after), value, {"increase": increase}


def _xid(rule: XidRule, s: Series, sample: GpuSample, t: float) -> Verdict:
    hits = [x for x in sample.xid_errors if x in rule.codes]
    if hits:
        s.last_hit = t
        return Cond.FIRE, float(hits[0]), {"codes": ", ".join(map(str, hits)), "xid": hits[0]}
    return _cleared_after(s, t, rule.clear_after), None, {}


def _track_steady(s: Series, value: Any, tolerance: float, t: float) -> None:
    """Follow the steady metric: smoothed (5 s half-life) so sample noise is no change; a move by more than
    `tolerance` from the level it held restarts the steady time."""
    if value is None:
        s.steady_ref = s.steady_smooth = s.steady_since = s.steady_t = None
        return
    v = float(value)
    if s.steady_smooth is None or s.steady_t is None or s.steady_ref is None:
        s.steady_smooth, s.steady_ref, s.steady_since, s.steady_t = v, v, t, t
        return
    dt = max(t - s.steady_t, 0.0)
    s.steady_t = t
    alpha = 1.0 - 0.5 ** (dt / STEADY_HALF_LIFE_S) if dt > 0 else 0.0
    s.steady_smooth += alpha * (v - s.steady_smooth)
    if abs(s.steady_smooth - s.steady_ref) > tolerance:
        s.steady_ref, s.steady_since = s.steady_smooth, t


def _steady(s: Series, rule: RateRule, t: float) -> bool:
    return s.steady_since is not None and t - s.steady_since >= rule.steady_for


def _half_slopes(points: Window) -> tuple[float | None, float | None] | None:
    """The slopes of the window's first and second halves (a one-off step grows only one of them); None
    when either half has too few points."""
    if len(points) < 6:
        return None
    mid = (points[0][0] + points[-1][0]) / 2
    first = [p for p in points if p[0] <= mid]
    second = [p for p in points if p[0] > mid]
    if len(first) < 3 or len(second) < 3:
        return None
    return slope_per_s(first), slope_per_s(second)


def _cleared_after(s: Series, t: float, clear_after: float) -> Cond:
    if s.firing and s.last_hit is not None and t - s.last_hit < clear_after:
        return Cond.HOLD
    return Cond.CLEAR
