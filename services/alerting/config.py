"""The alerting configuration file: rules, route tree, receivers, inhibition and incidents.

One YAML file (`WHALEFLUX_ALERTING_RULES_FILE`, default: `default_rules.yaml`
next to this module). It is validated as a whole at load; every problem is
reported as `FILE:LINE: key: problem` by the shared loader
(`whaleflux.shared.yamlconfig`, as for assets and the price book), so an
operator can fix a file without guessing. The service keeps the
previous good configuration when a reloaded file is bad.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from whaleflux.shared import yamlconfig
from whaleflux.shared.contracts import FindingKind
from whaleflux.shared.yamlconfig import ConfigFileError, KeyPath

from .dispatch.matchers import Matcher, parse_matchers

DEFAULT_RULES_FILE = Path(__file__).parent / "default_rules.yaml"

# Prometheus durations, compound ones too ("1h30m", "2m30s", "1d12h"); units largest first, each at most once.
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)w)?(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
                       r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")
_UNITS = (604800.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)


def parse_duration(value: Any) -> float:
    """Seconds from a Prometheus-style duration ("500ms", "30s", "5m", "4h", "1h30m") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 4h")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m and any(m.groups()):
            return sum(float(g) * unit for g, unit in zip(m.groups(), _UNITS, strict=True) if g)
    raise ValueError("expected a duration such as 30s, 5m, 4h or 1h30m")


Duration = Annotated[float, BeforeValidator(parse_duration)]
Severity = Literal["info", "warning", "critical"]
Category = Literal["health", "thermal", "cost", "capacity", "job"]
Op = Literal[">", ">=", "<", "<="]


def _matchers(value: Any) -> list[Matcher]:
    return parse_matchers(value)


Matchers = Annotated[list[Matcher], BeforeValidator(_matchers)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


# --------------------------------------------------------------------------- rules


class RuleBase(_Strict):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=64)
    severity: Severity = "warning"
    category: Category = "health"
    for_s: Duration = Field(0.0, alias="for")
    summary: str = Field(min_length=1, description="str.format template; fields depend on the kind")
    # `drain`: publish node.drain_requested for the alert's node, once per incident.
    actions: list[Literal["drain"]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels put on the alert")
    models: list[str] = Field(default_factory=list, description="GPU models this rule applies to; empty means all")


class Threshold(_Strict):
    """Where a limit comes from, in order of preference: the device, per-model values, the catalogue, a constant."""

    device: str | None = Field(None, description="GpuSample field the device reports, e.g. slowdown_temperature_c")
    per_model: dict[str, float] = Field(default_factory=dict)
    model: str | None = Field(None, description="gpu_models.yaml field, e.g. temp_slowdown_c")
    value: float | None = None
    offset: float = Field(0.0, description="added to the limit found, e.g. -5 for 'five degrees under slowdown'")

    @model_validator(mode="after")
    def _some_source(self) -> Threshold:
        if self.device is None and not self.per_model and self.model is None and self.value is None:
            raise ValueError("give at least one of device, per_model, model, value")
        return self


class ThresholdRule(RuleBase):
    kind: Literal["threshold"]
    metric: str
    op: Op = ">="
    threshold: Threshold
    hysteresis: float = Field(0.0, ge=0, description="resolve only this far back on the safe side")
    # Not resolved because a drain idled the GPU: with `resolve_under_load`, back on the safe side resolves at
    # once only under load (utilization at least this %); otherwise after `resolve_hold` there.
    resolve_under_load: float | None = Field(None, ge=0, le=100, description="utilization %% that counts as load")
    resolve_hold: Duration = Field(1800.0, description="without load: how long back on the safe side to resolve")


class RateRule(RuleBase):
    """The metric moves faster than `per_minute` (e.g. temperature rising 10 C/min)."""

    kind: Literal["rate"]
    metric: str
    per_minute: float = Field(description="positive: rising at least this fast; negative: falling")
    window: Duration = 60.0
    min_samples: int = Field(5, ge=2)
    # A GPU heats up fast whenever a job starts or its load goes up: that is no fault. With `steady_metric`
    # (e.g. power_ratio) the rule fires only once that metric has stayed within `steady_tolerance` (its own
    # units, smoothed over a few seconds) for `steady_for`: heating at constant power means cooling trouble.
    steady_metric: str | None = None
    steady_tolerance: float = Field(0.1, gt=0)
    steady_for: Duration = 120.0


class TrendRule(RuleBase):
    """The metric's linear trend reaches `limit_metric` within `within` (memory leak, OOM risk)."""

    kind: Literal["trend"]
    metric: str = "memory_used_mib"
    limit_metric: str = "memory_total_mib"
    window: Duration = 120.0
    within: Duration = 600.0
    min_samples: int = Field(10, ge=3)
    min_slope_per_s: float = Field(0.0, ge=0, description="ignore slower growth (noise)")
    # A job that starts (or loads a model) steps memory up once: that is no leak. Sustained: the growth
    # must show in both halves of the window, each at least `min_slope_per_s`.
    sustained: bool = True


class CounterRule(RuleBase):
    """A cumulative counter grew by at least `increase` within `window` (ECC, remapped rows, NVLink CRC)."""

    kind: Literal["counter"]
    metric: str
    increase: float = Field(1.0, gt=0)
    window: Duration = 60.0
    clear_after: Duration = Field(600.0, description="resolve after this long without a qualifying increase")


class FlagRule(RuleBase):
    """A boolean the device reports is true (row-remap failure)."""

    kind: Literal["flag"]
    metric: str


class XidRule(RuleBase):
    kind: Literal["xid"]
    codes: list[int] = Field(min_length=1)
    clear_after: Duration = 600.0


class ThrottleRule(RuleBase):
    """Any of `reasons` is among the sample's throttle reasons (power brake, thermal slowdown)."""

    kind: Literal["throttle"]
    reasons: list[str] = Field(min_length=1)


BaselineKey = Literal["gpu", "model", "workload_class", "node", "pool"]


def _per_gpu() -> list[BaselineKey]:
    return ["gpu"]


class BaselineRule(RuleBase):
    """Far above the usual: an EWMA mean and variance learned per `by` (one GPU by default; shipped: per GPU
    model and workload class), quiet until `warm_up` samples were seen.

    The workload class of a sample is `idle` (no process, utilization under 5%), the class of the
    WhaleFlux job on the GPU (from job.submitted), or `unknown`. After a GPU's class changes its
    samples are neither judged nor learned for `settle` (the heating or cooling transient).
    """

    kind: Literal["baseline"]
    metric: str
    by: list[BaselineKey] = Field(default_factory=lambda: _per_gpu(), min_length=1)
    settle: Duration = 0.0
    half_life: Duration = 600.0
    warm_up: int = Field(120, ge=2)
    sigmas: float = Field(4.0, gt=0)
    min_delta: float = Field(0.0, ge=0, description="and at least this far above the mean")
    resolve_sigmas: float = Field(2.0, ge=0)
    min_spread: float = Field(1.0, gt=0, description="the smallest standard deviation a baseline counts: idle "
                              "GPUs hold their temperature within tenths of a degree, which is no yardstick")


class HeartbeatRule(RuleBase):
    """No telemetry or heartbeat from a known node for `for`."""

    kind: Literal["heartbeat"]


class EventRule(RuleBase):
    """Raise on an event (lease.expiring, job.failed ...); resolves after `resolve_after`."""

    kind: Literal["event"]
    event: Literal["lease.expiring", "lease.expired", "job.failed", "job.finished", "job.rejected"]
    key: list[str] = Field(min_length=1, description="event fields that identify one alert (become labels)")
    label_fields: list[str] = Field(default_factory=list,
                                    description="more event fields that become labels (not identity), e.g. team")
    annotation_fields: list[str] = Field(default_factory=list,
                                         description="event fields that become annotations, e.g. log_tail")
    resolve_after: Duration = 86400.0


class FindingRule(RuleBase):
    """A cost guardian: a finding inventory reports (GET /v1/findings), e.g. reserved GPUs idle for days.

    Fires while inventory lists a finding of kind `finding`, resolves when a later
    successful poll no longer does. One alert per `key` (finding fields such as
    model, ownership, pool), so the same idle reservation is one alert however
    long it stays idle.
    """

    kind: Literal["finding"]
    finding: FindingKind
    key: list[str] = Field(default_factory=lambda: ["model", "ownership", "pool"], min_length=1,
                           description="finding fields (detail first) that identify one alert; they become labels")
    min_monthly_usd: float = Field(0.0, ge=0, description="ignore findings whose monthly cost is known and lower")


Rule = Annotated[
    ThresholdRule | RateRule | TrendRule | CounterRule | FlagRule | XidRule | ThrottleRule | BaselineRule
    | HeartbeatRule | EventRule | FindingRule,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- routing


class RouteConfig(_Strict):
    receiver: str | None = None
    matchers: Matchers = Field(default_factory=list)
    continue_: bool = Field(False, alias="continue")
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    routes: list[RouteConfig] = Field(default_factory=list)


class RateLimit(_Strict):
    per_second: float = Field(gt=0)
    burst: int = Field(10, ge=1)


class ReceiverConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    type: Literal["webhook", "pagerduty", "slack", "teams", "alertmanager"]
    # URLs may embed tokens (Slack, Teams): prefer `url_env` so the file holds no secret.
    url: str | None = None
    url_env: str | None = Field(None, description="environment variable holding the URL (comma-separated for webhooks)")
    routing_key_env: str | None = Field(None, description="pagerduty: environment variable holding the integration key")
    routing_key: str | None = Field(None, description="pagerduty: integration key (prefer routing_key_env)")
    rate_limit: RateLimit | None = None
    send_resolved: bool = True

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


class InhibitRuleConfig(_Strict):
    source_matchers: Matchers
    target_matchers: Matchers
    equal: list[str] = Field(default_factory=list)


class CorrelationConfig(_Strict):
    name: str
    matchers: Matchers = Field(default_factory=list)
    by: list[str] = Field(min_length=1, description="labels whose values make one incident")
    title: str = Field(min_length=1, description="str.format template over the `by` labels, `count`, `alerts`, "
                       "`alertnames`, `nodes`, `node_count` and `summary` (the latest firing member's)")
    # while_firing: a new alert with this key joins the incident while any member fires (or within `window`
    # of its last activity): a rack stays one incident while it is hot. within_window: only within `window`
    # of the incident's last new member: a GPU that stays down for hours does not pull every later fault
    # of its pool into its incident.
    join: Literal["while_firing", "within_window"] = "while_firing"
    window: Duration | None = Field(None, description="within_window: this correlation's window (default: window)")


class IncidentsConfig(_Strict):
    window: Duration = 600.0
    # Alerts sharing one of these labels' values with a firing member of an open incident join it
    # before any correlation is tried: several symptoms of one GPU are one incident.
    join_on: list[str] = Field(default_factory=lambda: ["UUID"])
    correlate: list[CorrelationConfig] = Field(default_factory=list)


class AlertingConfig(_Strict):
    rules: list[Rule] = Field(default_factory=list)
    route: RouteConfig = Field(default_factory=lambda: RouteConfig(receiver="default"))
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    inhibit_rules: list[InhibitRuleConfig] = Field(default_factory=list)
    incidents: IncidentsConfig = Field(default_factory=IncidentsConfig)

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)


# --------------------------------------------------------------------------- loading

Path_ = KeyPath


class ConfigError(ConfigFileError):
    """The file was rejected; `errors` are `FILE:LINE: key: problem` lines."""


_KINDS = {"threshold", "rate", "trend", "counter", "flag", "xid", "throttle", "baseline", "heartbeat", "event",
          "finding"}


def _error_path(err: dict) -> Path_:
    """Where a pydantic error points: without the union tag (`rules.0.threshold.metric` -> `rules.0.metric`),
    and at the `kind:` line when the kind itself is wrong (not the item's first line)."""
    loc = tuple(err["loc"])
    if len(loc) >= 3 and loc[0] == "rules" and isinstance(loc[1], int) and loc[2] in _KINDS:
        loc = (*loc[:2], *loc[3:])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc = (*loc, "kind")
    return loc


def parse_config(text: str, filename: str = "rules.yaml") -> AlertingConfig:
    """Parse and check a configuration; raise ConfigError listing every problem with file, line and key."""
    located = yamlconfig.parse(text, filename, ConfigError, "a mapping with rules, route, receivers")
    config = yamlconfig.validate(located, AlertingConfig, ConfigError, locate=_error_path)
    problems = cross_check(config)
    if problems:
        raise ConfigError(located.problems(problems))
    return config


def cross_check(config: AlertingConfig) -> list[tuple[Path_, str]]:
    """Checks across entries: unique names, receivers that exist, metrics that exist, templates that format."""
    from whaleflux.shared.catalog import GpuModel
    from whaleflux.shared.events import GpuSample

    from .rules.metrics import DERIVED_METRICS

    problems: list[tuple[Path_, str]] = []
    sample_fields = set(GpuSample.model_fields) | set(DERIVED_METRICS)
    seen: set[str] = set()
    for i, rule in enumerate(config.rules):
        if rule.name in seen:
            problems.append((("rules", i, "name"), f"duplicate rule name {rule.name!r}"))
        seen.add(rule.name)
        for attr in ("metric", "limit_metric", "steady_metric"):
            value = getattr(rule, attr, None)
            if value is not None and value not in sample_fields:
                problems.append((("rules", i, attr), f"unknown metric {value!r}"))
        threshold = getattr(rule, "threshold", None)
        if threshold is not None:
            if threshold.device is not None and threshold.device not in GpuSample.model_fields:
                problems.append((("rules", i, "threshold", "device"), f"unknown GpuSample field {threshold.device!r}"))
            if threshold.model is not None and threshold.model not in GpuModel.model_fields:
                problems.append((("rules", i, "threshold", "model"),
                                 f"unknown gpu_models.yaml field {threshold.model!r}"))
        if isinstance(rule, ThresholdRule):
            problems.extend(_limit_problems(rule.metric, rule.threshold, ("rules", i, "threshold")))
        if "drain" in rule.actions and rule.kind in ("event", "finding"):
            problems.append((("rules", i, "actions"), f"drain needs a node: not available on {rule.kind} rules"))
    names = [r.name for r in config.receivers]
    for i, name in enumerate(names):
        if names.index(name) != i:
            problems.append((("receivers", i, "name"), f"duplicate receiver {name!r}"))
    for i, recv in enumerate(config.receivers):
        if recv.url is None and recv.url_env is None and recv.type != "pagerduty":
            problems.append((("receivers", i), "give url or url_env"))
        if recv.type == "pagerduty" and recv.routing_key is None and recv.routing_key_env is None:
            problems.append((("receivers", i), "pagerduty needs routing_key_env (or routing_key)"))

    def walk(route: RouteConfig, path: Path_, root: bool) -> None:
        if root and route.receiver is None:
            problems.append(((*path, "receiver"), "the root route needs a receiver"))
        if route.receiver is not None and route.receiver not in names:
            problems.append(((*path, "receiver"), f"no receiver named {route.receiver!r}"))
        for j, child in enumerate(route.routes):
            walk(child, (*path, "routes", j), False)

    walk(config.route, ("route",), True)
    return problems


def _limit_problems(metric: str, threshold: Threshold, at: Path_) -> list[tuple[Path_, str]]:
    """Limits a threshold gives that lie outside `metric`'s physical range (rules/ranges.py): its constant, each
    per-model value and, for a catalogue field, every catalogued model's, each with the offset added."""
    from whaleflux.shared.catalog import gpu_models

    from .rules.ranges import limit_problem

    offset = f" (with offset {threshold.offset:g})" if threshold.offset else ""
    limits: list[tuple[Path_, float]] = []
    if threshold.value is not None:
        limits.append(((*at, "value"), threshold.value))
    limits += [((*at, "per_model", key), value) for key, value in threshold.per_model.items()]
    if threshold.model is not None:
        for model in gpu_models().values():
            value = getattr(model, threshold.model, None)
            if isinstance(value, (int, float)):
                limits.append(((*at, "offset" if threshold.offset else "model"), float(value)))
    out: dict[Path_, str] = {}
    for path, value in limits:
        problem = limit_problem(metric, value + threshold.offset)
        if problem is not None:
            out.setdefault(path, problem + offset)  # one line per key, not one per catalogued model
    return list(out.items())


def load_config(path: str | Path) -> AlertingConfig:
    return parse_config(yamlconfig.read(path, ConfigError), str(path))
