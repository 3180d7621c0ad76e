"""Rule evaluation: samples, heartbeats and events in, firing/resolved transitions out. No I/O; time passed in.

Each rule kind decides, per series (one GPU, node or event key), whether its
condition holds (FIRE), clearly does not (CLEAR), or sits in between (HOLD:
inside a hysteresis band, or waiting out `clear_after`). The engine adds the
shared parts: `for` durations (a condition must hold that long before firing),
one alert per series, and a stable fingerprint from identity labels.
"""

from __future__ import annotations

import enum
import operator
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from whaleflux.shared.catalog import GpuModel, model_key
from whaleflux.shared.events import GpuSample, GpuTelemetry

from ..config import (
    AlertingConfig,
    BaselineRule,
    CounterRule,
    EventRule,
    FindingRule,
    FlagRule,
    HeartbeatRule,
    RateRule,
    RuleBase,
    Threshold,
    ThresholdRule,
    ThrottleRule,
    TrendRule,
    XidRule,
)
from .baseline import Ewma
from .metrics import metric_value
from .thermal import fingerprint
from .trend import Window, seconds_to_limit, slope_per_s

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
FINGERPRINT_CACHE = 500_000
JOB_CLASS_KEEP = 200_000
IDLE_BELOW_PCT = 5.0
GPU_KINDS = (ThresholdRule, RateRule, TrendRule, CounterRule, FlagRule, XidRule, ThrottleRule, BaselineRule)


class Cond(enum.Enum):
    FIRE = "fire"
    HOLD = "hold"
    CLEAR = "clear"


@dataclass(frozen=True)
class Transition:
    firing: bool
    rule: RuleBase
    fingerprint: str
    labels: dict[str, str]  # without alertname
    summary: str
    at: datetime
    value: float | None = None


@dataclass(frozen=True)
class NodeInfo:
    rack: str | None = None
    pool: str | None = None


@dataclass
class Series:
    firing: bool = False
    pending_since: float | None = None
    points: Window = field(default_factory=Window)
    last_hit: float | None = None
    owner: tuple | None = None  # trend rules: the processes on the GPU (job id, pid)
    workload_class: str | None = None  # baseline rules: the GPU's class now ...
    class_since: float = 0.0  # ... since when
    deadline: float | None = None  # event alerts: resolve at this time
    steady_ref: float | None = None  # rate rules with steady_metric: the level it holds ...
    steady_smooth: float | None = None  # ... its smoothed value ...
    steady_since: float | None = None  # ... and since when
    steady_t: float | None = None  # time of the last steady-metric sample
    labels: dict[str, str] = field(default_factory=dict)


class _Missing(dict):
    def __missing__(self, key):
        return "?"


def render(template: str, values: dict) -> str:
    """Format a summary template; a bad field or spec leaves the template readable rather than failing."""
    try:
        return template.format_map(_Missing(values))
    except (ValueError, TypeError, IndexError, AttributeError):
        return template


def resolve_threshold(t: Threshold, sample: GpuSample, model: GpuModel | None) -> float | None:
    """The limit for this GPU: device-reported first, then per-model, then the catalogue, then a constant."""
    limit = None
    if t.device is not None:
        limit = getattr(sample, t.device, None)
    if limit is None and model is not None and model.key in t.per_model:
        limit = t.per_model[model.key]
    if limit is None and model is not None and t.model is not None:
        limit = getattr(model, t.model, None)
    if limit is None:
        limit = t.value
    return None if limit is None else float(limit) + t.offset


class RuleEngine:
    def __init__(self, config: AlertingConfig, models: dict[str, GpuModel]):
        self.models = models
        self.series: dict[str, Series] = {}
        self.rule_of: dict[str, str] = {}  # fingerprint -> rule name
        self.nodes: dict[tuple[str, str], NodeInfo] = {}
        self.last_seen: dict[tuple[str, str], float] = {}
        self.baselines: dict[tuple, Ewma] = {}  # (rule, *by values) -> learned mean and variance
        self.job_classes: OrderedDict[str, str] = OrderedDict()  # job id -> workload class
        self._fingerprints: dict[tuple, str] = {}
        self.set_config(config)

    # ------------------------------------------------------------ configuration and state

    def set_config(self, config: AlertingConfig) -> None:
        """Swap rules; series of rules that are unchanged keep their state, others start afresh."""
        old = {r.name: r for r in getattr(self, "config", AlertingConfig()).rules}
        self.config = config
        self.gpu_rules = [r for r in config.rules if isinstance(r, GPU_KINDS)]
        self.heartbeat_rules = [r for r in config.rules if isinstance(r, HeartbeatRule)]
        self.event_rules = [r for r in config.rules if isinstance(r, EventRule)]
        self.finding_rules = [r for r in config.rules if isinstance(r, FindingRule)]
        new = {r.name: r for r in config.rules}
        for key in [k for k in self.baselines if old.get(k[0]) != new.get(k[0])]:
            del self.baselines[key]
        for fp, name in list(self.rule_of.items()):
            if name in new and old.get(name) != new[name] and not self.series[fp].firing:
                self.series.pop(fp, None)
                self.rule_of.pop(fp, None)

    def restore_firing(self, fingerprint: str, rule: str, labels: dict[str, str], starts_at: datetime, now: datetime) -> None:
        """After a restart: this alert is firing, so the engine can resolve it later."""
        s = self.series.setdefault(fingerprint, Series())
        s.firing, s.labels = True, labels
        s.last_hit = now.timestamp()
        r = self.config.rule(rule)
        if isinstance(r, EventRule):
            s.deadline = starts_at.timestamp() + r.resolve_after
        self.rule_of[fingerprint] = rule

    def observe_node(self, cluster: str, node: str, info: NodeInfo | None, now: datetime) -> None:
        """A node registered (info) or sent a heartbeat (info None): it is alive now."""
        if info is not None:
            self.nodes[(cluster, node)] = info
        self.last_seen[(cluster, node)] = max(self.last_seen.get((cluster, node), 0.0), now.timestamp())

    # ------------------------------------------------------------ telemetry

    def observe_telemetry(self, batch: GpuTelemetry, now: datetime) -> list[Transition]:
        self.observe_node(batch.cluster, batch.node, None, now)
        info = self.nodes.get((batch.cluster, batch.node), NodeInfo())
        t = batch.sample_time.timestamp()
        out: list[Transition] = []
        for sample in batch.gpus:
            key = model_key(sample.model)
            model = self.models.get(key) if key else None
            ident = {"UUID": sample.uuid, "gpu": str(sample.index), "Hostname": batch.node,
                     "cluster": batch.cluster, "modelName": sample.model}
            where = (sample.uuid, sample.index, batch.node, batch.cluster, sample.model)
            cls = None
            for rule in self.gpu_rules:
                if rule.models and key not in rule.models:
                    continue
                fp = self._fingerprints.get((rule.name, where))
                if fp is None:
                    if len(self._fingerprints) > FINGERPRINT_CACHE:
                        self._fingerprints.clear()
                    fp = self._fingerprints[(rule.name, where)] = fingerprint({"alertname": rule.name, **ident})
                s = self.series.get(fp)
                if s is None:
                    s = self.series[fp] = Series()
                    self.rule_of[fp] = rule.name
                if isinstance(rule, BaselineRule):
                    if cls is None:
                        cls = self.workload_class(sample)
                    verdict = self._baseline(rule, s, sample, t, cls, (batch.node, info.pool))
                else:
                    verdict = self._evaluate(rule, s, sample, model, t)
                if verdict is None:
                    continue
                cond, value, values = verdict
                # Most samples change nothing: skip building labels for them.
                if cond is Cond.FIRE:
                    if s.firing:
                        continue
                elif not s.firing or cond is Cond.HOLD:
                    s.pending_since = None
                    continue
                labels = {**ident, **({"rack": info.rack} if info.rack else {}), **({"pool": info.pool} if info.pool else {}),
                          **rule.labels}
                values = {"uuid": sample.uuid, "gpu": sample.index, "node": batch.node, "cluster": batch.cluster,
                          "model": sample.model, "value": value, **values}
                tr = self._step(rule, s, fp, cond, value, labels, values, t, batch.sample_time)
                if tr is not None:
                    out.append(tr)
        return out

    def _evaluate(self, rule, s: Series, sample: GpuSample, model: GpuModel | None, t: float):
        """(condition, value, template values) for one rule on one sample; None when it cannot be evaluated."""
        if isinstance(rule, ThresholdRule):
            value = metric_value(sample, rule.metric)
            limit = resolve_threshold(rule.threshold, sample, model)
            if value is None or limit is None:
                return None
            op = _OPS[rule.op]
            back = -rule.hysteresis if rule.op in (">", ">=") else rule.hysteresis
            if op(value, limit):
                cond = Cond.FIRE
            elif op(value, limit + back):
                cond = Cond.HOLD
            else:
                cond = Cond.CLEAR
            return cond, float(value), {"threshold": limit}
        if isinstance(rule, (RateRule, TrendRule)):
            value = metric_value(sample, rule.metric)
            if value is None:
                return None
            if isinstance(rule, TrendRule):
                # The trend of what runs now: when the processes on the GPU change (a job ends, another
                # starts), the memory they hold steps; start the window afresh.
                owner = tuple(sorted((p.job_id or "", p.pid) for p in sample.processes))
                if owner != s.owner:
                    s.owner = owner
                    s.points.clear()
            s.points.push(t, float(value), rule.window)
            if isinstance(rule, RateRule) and rule.steady_metric is not None:
                _track_steady(s, metric_value(sample, rule.steady_metric), rule.steady_tolerance, t)
            slope = s.points.slope() if len(s.points) >= rule.min_samples else None
            if slope is None or s.points[-1][0] - s.points[0][0] < rule.window / 2:
                return Cond.HOLD if s.firing else Cond.CLEAR, float(value), {}
            if isinstance(rule, RateRule):
                per_min = slope * 60
                if rule.steady_metric is not None and not _steady(s, rule, t):
                    return Cond.HOLD if s.firing else Cond.CLEAR, float(value), {"per_minute": per_min}
                want = rule.per_minute
                hit = per_min >= want if want >= 0 else per_min <= want
                half = per_min >= want / 2 if want >= 0 else per_min <= want / 2
                return (Cond.FIRE if hit else Cond.HOLD if half else Cond.CLEAR), float(value), {"per_minute": per_min}
            limit = metric_value(sample, rule.limit_metric)
            if limit is None:
                return None
            eta = seconds_to_limit(float(value), float(limit), slope) if slope > rule.min_slope_per_s else None
            if eta is not None and eta <= rule.within and (not rule.sustained or _sustained(s.points, rule.min_slope_per_s)):
                cond = Cond.FIRE
            elif eta is not None and eta <= 2 * rule.within:
                cond = Cond.HOLD
            else:
                cond = Cond.CLEAR
            return cond, float(value), {"limit": float(limit), "eta_s": eta or 0.0, "eta_min": (eta or 0.0) / 60,
                                         "slope_per_s": slope}
        if isinstance(rule, CounterRule):
            value = metric_value(sample, rule.metric)
            if value is None:
                return None
            if s.points and value < s.points[-1][1]:
                s.points.clear()  # counter reset (driver reload): start counting again
            grew = bool(s.points) and value > s.points[-1][1]
            s.points.push(t, float(value), rule.window)
            increase = s.points[-1][1] - s.points[0][1]
            # Only a sample that grew the counter (re)starts the alert; clear_after runs from the last growth.
            if grew and increase >= rule.increase:
                s.last_hit = t
                return Cond.FIRE, float(value), {"increase": increase}
            return _cleared_after(s, t, rule.clear_after), float(value), {"increase": increase}
        if isinstance(rule, FlagRule):
            value = metric_value(sample, rule.metric)
            if value is None:
                return None
            return (Cond.FIRE if value else Cond.CLEAR), float(bool(value)), {}
        if isinstance(rule, XidRule):
            hits = [x for x in sample.xid_errors if x in rule.codes]
            if hits:
                s.last_hit = t
                return Cond.FIRE, float(hits[0]), {"codes": ", ".join(map(str, hits)), "xid": hits[0]}
            return _cleared_after(s, t, rule.clear_after), None, {}
        if isinstance(rule, ThrottleRule):
            hits = [r for r in sample.throttle_reasons if r in rule.reasons]
            return (Cond.FIRE if hits else Cond.CLEAR), float(len(hits)), {"reasons": ", ".join(hits)}
        return None

    # ------------------------------------------------------------ baselines and workload classes

    def observe_job(self, job_id: str, workload_class: str) -> None:
        """A job was submitted: its GPUs' samples belong to `workload_class` while it runs."""
        self.job_classes[job_id] = workload_class
        self.job_classes.move_to_end(job_id)
        while len(self.job_classes) > JOB_CLASS_KEEP:
            self.job_classes.popitem(last=False)

    def forget_job(self, job_id: str) -> None:
        self.job_classes.pop(job_id, None)

    def workload_class(self, sample: GpuSample) -> str:
        """`idle`, the class of the WhaleFlux job on the GPU, or `unknown` (a process we did not start)."""
        for p in sample.processes:
            if p.job_id:
                cls = self.job_classes.get(p.job_id)
                if cls is None and "-r" in p.job_id:  # a replica of a service: `<id>-r<i>`
                    cls = self.job_classes.get(p.job_id.rsplit("-r", 1)[0])
                if cls is not None:
                    return cls
        if not sample.processes and (sample.utilization_gpu_pct or 0) < IDLE_BELOW_PCT:
            return "idle"
        return "unknown"

    def _baseline(self, rule: BaselineRule, s: Series, sample: GpuSample, t: float, cls: str, where: tuple):
        value = metric_value(sample, rule.metric)
        if value is None:
            return None
        value = float(value)
        if s.workload_class != cls:
            s.workload_class, s.class_since = cls, t
        parts = {"gpu": sample.uuid, "model": sample.model, "workload_class": cls, "node": where[0],
                 "pool": where[1] or ""}
        key = (rule.name, *(parts[b] for b in rule.by))
        e = self.baselines.get(key)
        if e is None:
            e = self.baselines[key] = Ewma(rule.half_life)
        hold = Cond.HOLD if s.firing else Cond.CLEAR
        extra = {"mean": e.mean, "sigmas": 0.0, "workload_class": cls, "samples": e.n}
        if t - s.class_since < rule.settle:
            return hold, value, extra  # heating or cooling toward its new load: neither judged nor learned
        cond = hold
        if e.n >= rule.warm_up:
            z = e.zscore(value)
            extra["sigmas"] = z
            if z >= rule.sigmas and value - e.mean >= rule.min_delta:
                cond = Cond.FIRE
            elif z < rule.resolve_sigmas:
                cond = Cond.CLEAR
        if cond is not Cond.FIRE and not s.firing:
            e.update(value, t)  # an anomaly does not become the normal (nor widen the population's spread)
        return cond, value, extra

    def _step(self, rule: RuleBase, s: Series, fp: str, cond: Cond, value, labels, values, t: float, at: datetime):
        """Apply `for` and emit a transition when the alert starts or stops firing."""
        if cond is Cond.FIRE:
            if s.firing:
                return None
            if s.pending_since is None:
                s.pending_since = t
            if t - s.pending_since < rule.for_s:
                return None
            s.firing, s.pending_since, s.labels = True, None, labels
            return Transition(True, rule, fp, labels, render(rule.summary, values), at, value)
        s.pending_since = None
        if cond is Cond.CLEAR and s.firing:
            s.firing = False
            node = labels.get("Hostname", "?")
            where = f"GPU {labels['gpu']} on {node}" if "gpu" in labels else node
            shown = f" ({value:.4g})" if isinstance(value, float) else ""
            return Transition(False, rule, fp, s.labels or labels, f"{rule.name} resolved: {where}{shown}", at, value)
        return None

    # ------------------------------------------------------------ heartbeats, events, time

    def tick(self, now: datetime) -> list[Transition]:
        """Time-driven checks: missing nodes, event alerts that age out, alerts of rules that were removed."""
        t = now.timestamp()
        out: list[Transition] = []
        for rule in self.heartbeat_rules:
            for (cluster, node), seen in self.last_seen.items():
                info = self.nodes.get((cluster, node), NodeInfo())
                ident = {"Hostname": node, "cluster": cluster}
                fp = fingerprint({"alertname": rule.name, **ident})
                s = self.series.setdefault(fp, Series())
                self.rule_of[fp] = rule.name
                silent = t - seen
                labels = {**ident, **({"rack": info.rack} if info.rack else {}), **({"pool": info.pool} if info.pool else {}),
                          **rule.labels}
                if silent >= max(rule.for_s, 1.0) and not s.firing:
                    s.firing, s.labels = True, labels
                    values = {"node": node, "cluster": cluster, "value": silent, "silent_s": silent}
                    out.append(Transition(True, rule, fp, labels, render(rule.summary, values), now, silent))
                elif silent < max(rule.for_s, 1.0) and s.firing:
                    s.firing = False
                    out.append(Transition(False, rule, fp, s.labels, f"{rule.name} resolved: {node} reporting again", now, silent))
        names = {r.name for r in self.config.rules}
        for fp, s in self.series.items():
            if not s.firing:
                continue
            name = self.rule_of.get(fp)
            rule = self.config.rule(name) if name in names else None
            if rule is None or (s.deadline is not None and t >= s.deadline):
                s.firing = False
                out.append(Transition(False, rule or _Removed(name), fp, s.labels, f"{name} resolved", now))
        return out

    def observe_event(self, name: str, data, now: datetime) -> list[Transition]:
        out = []
        for rule in self.event_rules:
            if rule.event != name:
                continue
            fields = data.model_dump(mode="json")
            ident = {k: str(fields.get(k, "")) for k in rule.key}
            fp = fingerprint({"alertname": rule.name, **ident})
            s = self.series.setdefault(fp, Series())
            self.rule_of[fp] = rule.name
            s.deadline = now.timestamp() + rule.resolve_after
            if s.firing:
                continue
            s.firing, s.labels = True, {**ident, **rule.labels}
            out.append(Transition(True, rule, fp, s.labels, render(rule.summary, fields), now))
        return out

    # ------------------------------------------------------------ cost guardians

    def observe_findings(self, findings: list[dict], now: datetime) -> list[Transition]:
        """One successful poll of inventory's findings: raise the new ones, resolve those no longer listed.

        `findings` is the JSON of GET /v1/findings: `{kind, severity, summary, monthly_usd, gpus, detail}`.
        """
        out: list[Transition] = []
        for rule in self.finding_rules:
            present: dict[str, tuple[dict[str, str], dict]] = {}
            for f in findings:
                if not isinstance(f, dict) or f.get("kind") != rule.finding:
                    continue
                usd = _number(f.get("monthly_usd"))
                if usd is not None and usd < rule.min_monthly_usd:
                    continue
                ident = finding_identity(rule, f)
                present[fingerprint({"alertname": rule.name, **ident})] = (ident, f)
            for fp, (ident, f) in present.items():
                s = self.series.setdefault(fp, Series())
                self.rule_of[fp] = rule.name
                if s.firing:
                    continue
                detail = f.get("detail") if isinstance(f.get("detail"), dict) else {}
                usd = _number(f.get("monthly_usd"))
                values = {**detail, **ident, "summary": f.get("summary", ""), "finding": rule.finding,
                          "monthly_usd": usd if usd is not None else float("nan"), "gpus": len(f.get("gpus") or []),
                          "value": usd}
                s.firing, s.labels = True, {**ident, **rule.labels}
                out.append(Transition(True, rule, fp, s.labels, render(rule.summary, values), now, usd))
            for fp, name in list(self.rule_of.items()):
                if name != rule.name or fp in present:
                    continue
                s = self.series.get(fp)
                if s is not None and s.firing:
                    s.firing = False
                    what = ", ".join(f"{k} {v}" for k, v in s.labels.items() if k != "finding" and v)
                    out.append(Transition(False, rule, fp, s.labels, f"{rule.name} resolved: {what} no longer reported", now))
        return out


def finding_identity(rule: FindingRule, finding: dict) -> dict[str, str]:
    """The labels that make one finding alert: the rule's `key` fields (from `detail`, else the finding itself).

    A finding that carries none of them is identified by its GPUs instead.
    """
    detail = finding.get("detail") if isinstance(finding.get("detail"), dict) else {}
    ident = {"finding": rule.finding}
    for k in rule.key:
        v = detail.get(k, finding.get(k))
        if v is not None and not isinstance(v, (dict, list)):
            ident[k] = str(v)
    if len(ident) == 1:
        gpus = sorted(str(g) for g in finding.get("gpus") or [])
        ident["gpus"] = fingerprint({"gpus": ",".join(gpus)}) if gpus else fingerprint({"summary": str(finding.get("summary"))})
    return ident


def _number(value) -> float | None:
    """A JSON number or decimal string (inventory sends money as strings); None when absent or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class _Removed:
    """Stands in for a rule deleted from the file while its alert fired."""

    name: str
    severity: str = "info"
    category: str = "health"
    actions: tuple = ()


STEADY_HALF_LIFE_S = 5.0


def _track_steady(s: Series, value, tolerance: float, t: float) -> None:
    """Follow the steady metric: smoothed (5 s half-life) so sample noise is no change; a move by more than
    `tolerance` from the level it held restarts the steady time."""
    if value is None:
        s.steady_ref = s.steady_smooth = s.steady_since = s.steady_t = None
        return
    v = float(value)
    if s.steady_smooth is None or s.steady_t is None:
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


def _sustained(points: Window, min_slope: float) -> bool:
    """The growth shows in both halves of the window (a one-off step does not)."""
    if len(points) < 6:
        return False
    mid = (points[0][0] + points[-1][0]) / 2
    first = [p for p in points if p[0] <= mid]
    second = [p for p in points if p[0] > mid]
    if len(first) < 3 or len(second) < 3:
        return False
    a, b = slope_per_s(first), slope_per_s(second)
    return a is not None and b is not None and a > min_slope and b > min_slope


def _cleared_after(s: Series, t: float, clear_after: float) -> Cond:
    if s.firing and s.last_hit is not None and t - s.last_hit < clear_after:
        return Cond.HOLD
    return Cond.CLEAR
