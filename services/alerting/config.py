"""The alerting configuration file: rules, route tree, receivers, inhibition and incidents.

One YAML file (`WHALEFLUX_ALERTING_RULES_FILE`, default: `default_rules.yaml`
next to this module). It is validated as a whole at load; every problem is
reported as `FILE:LINE: key: problem`, with the line taken from PyYAML's node
marks, so an operator can fix a file without guessing. The service keeps the
previous good configuration when a reloaded file is bad.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from .dispatch.matchers import Matcher, parse_matchers

DEFAULT_RULES_FILE = Path(__file__).parent / "default_rules.yaml"

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from a Prometheus-style duration ("500ms", "30s", "5m", "4h") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 4h")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value.strip())
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ValueError("expected a duration such as 30s, 5m or 4h")


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
    def _some_source(self) -> "Threshold":
        if self.device is None and not self.per_model and self.model is None and self.value is None:
            raise ValueError("give at least one of device, per_model, model, value")
        return self


class ThresholdRule(RuleBase):
    kind: Literal["threshold"]
    metric: str
    op: Op = ">="
    threshold: Threshold
    hysteresis: float = Field(0.0, ge=0, description="resolve only this far back on the safe side")


class RateRule(RuleBase):
    """The metric moves faster than `per_minute` (e.g. temperature rising 10 C/min)."""

    kind: Literal["rate"]
    metric: str
    per_minute: float = Field(description="positive: rising at least this fast; negative: falling")
    window: Duration = 60.0
    min_samples: int = Field(5, ge=2)


class TrendRule(RuleBase):
    """The metric's linear trend reaches `limit_metric` within `within` (memory leak, OOM risk)."""

    kind: Literal["trend"]
    metric: str = "memory_used_mib"
    limit_metric: str = "memory_total_mib"
    window: Duration = 120.0
    within: Duration = 600.0
    min_samples: int = Field(10, ge=3)
    min_slope_per_s: float = Field(0.0, ge=0, description="ignore slower growth (noise)")


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


class BaselineRule(RuleBase):
    """Far above this GPU's own EWMA baseline; quiet until `warm_up` samples were seen."""

    kind: Literal["baseline"]
    metric: str
    half_life: Duration = 600.0
    warm_up: int = Field(120, ge=2)
    sigmas: float = Field(4.0, gt=0)
    min_delta: float = Field(0.0, ge=0, description="and at least this far above the mean")
    resolve_sigmas: float = Field(2.0, ge=0)


class HeartbeatRule(RuleBase):
    """No telemetry or heartbeat from a known node for `for`."""

    kind: Literal["heartbeat"]


class EventRule(RuleBase):
    """Raise on an event (lease.expiring, job.failed ...); resolves after `resolve_after`."""

    kind: Literal["event"]
    event: Literal["lease.expiring", "lease.expired", "job.failed", "job.rejected"]
    key: list[str] = Field(min_length=1, description="event fields that identify one alert (become labels)")
    resolve_after: Duration = 86400.0


Rule = Annotated[
    ThresholdRule | RateRule | TrendRule | CounterRule | FlagRule | XidRule | ThrottleRule | BaselineRule | HeartbeatRule | EventRule,
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
    routes: list["RouteConfig"] = Field(default_factory=list)


class RateLimit(_Strict):
    per_second: float = Field(gt=0)
    burst: int = Field(10, ge=1)


class ReceiverConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    type: Literal["webhook", "pagerduty", "slack", "teams"]
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
    title: str = Field(min_length=1, description="str.format template over the `by` labels, `count`, `alertnames`")


class IncidentsConfig(_Strict):
    window: Duration = 600.0
    correlate: list[CorrelationConfig] = Field(default_factory=list)


class AlertingConfig(_Strict):
    rules: list[Rule] = Field(default_factory=list)
    route: RouteConfig = Field(default_factory=lambda: RouteConfig(receiver="default"))
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    inhibit_rules: list[InhibitRuleConfig] = Field(default_factory=list)
    incidents: IncidentsConfig = Field(default_factory=IncidentsConfig)

    def rule(self, name: str):
        return next((r for r in self.rules if r.name == name), None)


# --------------------------------------------------------------------------- loading

Path_ = tuple[Any, ...]


class ConfigError(ValueError):
    """The file was rejected; `errors` are `FILE:LINE: key: problem` lines."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


def _lines(node: yaml.Node, path: Path_, out: dict[Path_, int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*path, key_node.value)
            out[sub] = key_node.start_mark.line + 1
            _lines(value_node, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def _key(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


def _line_of(path: Path_, lines: dict[Path_, int]) -> int:
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return 1


def _clean_loc(loc: tuple) -> Path_:
    """Drop pydantic's union tag (`rules.0.threshold.metric` -> `rules.0.metric`)."""
    if len(loc) >= 3 and loc[0] == "rules" and isinstance(loc[1], int) and loc[2] in _KINDS:
        return (*loc[:2], *loc[3:])
    return tuple(loc)


_KINDS = {"threshold", "rate", "trend", "counter", "flag", "xid", "throttle", "baseline", "heartbeat", "event"}


def parse_config(text: str, filename: str = "rules.yaml") -> AlertingConfig:
    """Parse and check a configuration; raise ConfigError listing every problem with file, line and key."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        doc = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError([f"{filename}:{mark.line + 1 if mark else 1}: (yaml): {exc.problem or exc}"]) from None
    finally:
        loader.dispose()
    lines: dict[Path_, int] = {}
    if node is not None:
        _lines(node, (), lines)
    doc = doc or {}
    if not isinstance(doc, dict):
        raise ConfigError([f"{filename}:1: (document): expected a mapping with rules, route, receivers"])
    try:
        config = AlertingConfig.model_validate(doc)
    except ValidationError as exc:
        errors = []
        for err in exc.errors(include_url=False, include_input=False):
            path = _clean_loc(tuple(err["loc"]))
            if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
                path = (*path, "kind")  # point at the `kind:` line, not the item's first line
            msg = err["msg"].removeprefix("Value error, ")
            errors.append(f"{filename}:{_line_of(path, lines)}: {_key(path)}: {msg}")
        raise ConfigError(errors) from None
    problems = cross_check(config)
    if problems:
        raise ConfigError([f"{filename}:{_line_of(p, lines)}: {_key(p)}: {msg}" for p, msg in problems])
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
        for attr in ("metric", "limit_metric"):
            value = getattr(rule, attr, None)
            if value is not None and value not in sample_fields:
                problems.append((("rules", i, attr), f"unknown metric {value!r}"))
        threshold = getattr(rule, "threshold", None)
        if threshold is not None:
            if threshold.device is not None and threshold.device not in GpuSample.model_fields:
                problems.append((("rules", i, "threshold", "device"), f"unknown GpuSample field {threshold.device!r}"))
            if threshold.model is not None and threshold.model not in GpuModel.model_fields:
                problems.append((("rules", i, "threshold", "model"), f"unknown gpu_models.yaml field {threshold.model!r}"))
        if "drain" in rule.actions and rule.kind == "event":
            problems.append((("rules", i, "actions"), "drain needs a node: not available on event rules"))
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


def load_config(path: str | Path) -> AlertingConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError([f"{p}:1: (file): cannot read: {exc.strerror}"]) from None
    return parse_config(text, str(p))
