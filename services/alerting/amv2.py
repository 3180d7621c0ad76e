"""Alertmanager's v2 API models (api/v2/openapi.yaml) and the conversions to and from WhaleFlux's own, so
amtool, Grafana's Alertmanager data source and Karma work against alerting unchanged. Pure: time passed in.

- alerts as `gettableAlert` (status `active` or `suppressed`, `silencedBy`,
  `inhibitedBy`, `receivers`), the filters of `GET /api/v2/alerts` (matchers,
  `active` / `silenced` / `inhibited`, `receiver` regex);
- `postableAlert` in (Prometheus, or another Alertmanager client, sending to
  WhaleFlux) as `alert.raised` / `alert.resolved`, with Alertmanager's endsAt
  semantics (an alert not posted again resolves at its endsAt, or
  `resolve_timeout` after it was posted without one);
- silences both ways (`gettableSilence`, `postableSilence`).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from whaleflux.shared.events import AlertRaised, AlertResolved

from .dispatch.groups import GroupedAlert
from .dispatch.matchers import Matcher, matches_all
from .dispatch.silences import Silence
from .rules.series import fingerprint

ZERO_TIME = "0001-01-01T00:00:00Z"
RESOLVE_TIMEOUT_S = 300.0  # Alertmanager's default resolve_timeout
Severity = Literal["info", "warning", "critical"]
Category = Literal["health", "thermal", "cost", "capacity", "job"]
_SEVERITIES: dict[str, Severity] = {s: s for s in get_args(Severity)}
_CATEGORIES: dict[str, Category] = {c: c for c in get_args(Category)}


def ts(value: datetime) -> str:
    """RFC 3339 as Alertmanager writes it (UTC, `Z`)."""
    return value.isoformat().replace("+00:00", "Z")


class AmMatcher(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = Field(min_length=1)
    value: str
    is_regex: bool = Field(alias="isRegex")
    is_equal: bool = Field(True, alias="isEqual")

    def text(self) -> str:
        op = {(False, True): "=", (False, False): "!=", (True, True): "=~", (True, False): "!~"}
        return f'{self.name}{op[(self.is_regex, self.is_equal)]}"{self.value}"'


class PostableSilence(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    id: str | None = None
    matchers: list[AmMatcher] = Field(min_length=1)
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: AwareDatetime = Field(alias="endsAt")
    created_by: str = Field(alias="createdBy")
    comment: str


class PostableAlert(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    labels: dict[str, str] = Field(min_length=1)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: AwareDatetime | None = Field(None, alias="startsAt")
    ends_at: AwareDatetime | None = Field(None, alias="endsAt")
    generator_url: str | None = Field(None, alias="generatorURL")


def parse_filters(filters: list[str]) -> list[Matcher]:
    """`filter` query values (`alertname="X"`, or several in braces `{a="b",c=~"d"}`) as matchers."""
    out = []
    for f in filters:
        text = f.strip()
        if text.startswith("{") and text.endswith("}"):
            text = text[1:-1]
        for part in _split(text):
            out.append(Matcher.parse(part))
    return out


def _split(text: str) -> list[str]:
    """Matchers separated by commas outside quotes."""
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"' and not cur.endswith("\\"):
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def matcher_json(m: Matcher) -> dict[str, Any]:
    return {"name": m.name, "value": m.value, "isRegex": m.op in ("=~", "!~"), "isEqual": m.op in ("=", "=~")}


def gettable_alert(a: GroupedAlert, receivers: list[str], silenced_by: list[str], inhibited_by: list[str],
                   external_url: str) -> dict[str, Any]:
    """A firing alert as `gettableAlert`: suppressed when a silence or a firing alert mutes it."""
    muted = bool(silenced_by or inhibited_by)
    return {
        "labels": a.labels,
        "annotations": a.annotations,
        "startsAt": ts(a.starts_at),
        "endsAt": ts(end) if (end := a.ends_at or a.expires_at) else ZERO_TIME,
        "updatedAt": ts(a.starts_at),
        "generatorURL": f"{external_url}/v1/alerts",
        "fingerprint": a.fingerprint,
        "receivers": [{"name": r} for r in sorted(receivers)],
        "status": {"state": "suppressed" if muted else "active", "silencedBy": silenced_by,
                   "inhibitedBy": inhibited_by, "mutedBy": []},
    }


def wanted(alert: dict[str, Any], matchers: list[Matcher], receiver: re.Pattern[str] | None, active: bool,
           silenced: bool, inhibited: bool) -> bool:
    """Alertmanager's filters of GET /api/v2/alerts (and of each group's alerts)."""
    st = alert["status"]
    if not active and st["state"] == "active":
        return False
    if not silenced and st["silencedBy"]:
        return False
    if not inhibited and st["inhibitedBy"]:
        return False
    if receiver is not None and not any(receiver.fullmatch(r["name"]) for r in alert["receivers"]):
        return False
    return matches_all(matchers, alert["labels"])


def gettable_silence(s: Silence, now: datetime) -> dict[str, Any]:
    end = min(s.ends_at, s.expired_at) if s.expired_at else s.ends_at
    return {
        "id": s.id, "status": {"state": s.state(now)}, "updatedAt": ts(s.expired_at or s.starts_at),
        "matchers": [matcher_json(m) for m in s.parsed()], "startsAt": ts(s.starts_at), "endsAt": ts(end),
        "createdBy": s.created_by, "comment": s.comment, "annotations": {},
    }


def silence_of(body: PostableSilence, silence_id: str, now: datetime) -> Silence:
    """Our silence for a postableSilence; a start in the past is now, as Alertmanager does. ValueError (the
    field named) when it cannot be one."""
    starts = max(body.starts_at, now)
    if body.ends_at <= starts:
        raise ValueError("endsAt: must be after startsAt and in the future")
    if not body.created_by.strip():
        raise ValueError("createdBy: missing")
    if not body.comment.strip():
        raise ValueError("comment: missing")
    return Silence(id=silence_id, matchers=[m.text() for m in body.matchers], starts_at=starts,
                   ends_at=body.ends_at, created_by=body.created_by[:128], comment=body.comment[:1000])


def alert_event(a: PostableAlert, now: datetime,
                resolve_timeout_s: float = RESOLVE_TIMEOUT_S) -> tuple[str, AlertRaised | AlertResolved]:
    """(event id, the alert event) for an alert posted to /api/v2/alerts, as Alertmanager takes it: resolved
    when its endsAt has passed; else firing until its endsAt, or `resolve_timeout_s` from now without one,
    unless posted again (Prometheus re-sends a firing alert with a later endsAt: that extends it). The id is
    the alert's firing and end, so the same post twice is one event."""
    labels = dict(a.labels)
    ends = a.ends_at if a.ends_at is not None and a.ends_at.year > 1 else None  # Go's zero time: not set
    rule = labels.pop("alertname", "") or "unnamed"
    severity = labels.pop("severity", "warning")
    category = labels.pop("category", "health")
    fp = fingerprint({"alertname": rule, **a.labels})
    starts = a.starts_at if a.starts_at is not None and a.starts_at.year > 1 else now
    summary = a.annotations.get("summary") or a.annotations.get("description") or rule
    stamp = int(starts.timestamp() * 1000)
    if ends is not None and ends <= now:
        return f"amv2-resolved-{fp}-{stamp}", AlertResolved(fingerprint=fp, rule=rule, labels=labels,
                                                            summary=summary, starts_at=starts, ends_at=ends)
    annotations = {k: v for k, v in a.annotations.items() if k != "summary"}
    sev: Severity = _SEVERITIES.get(severity, "warning")
    cat: Category = _CATEGORIES.get(category, "health")
    if sev != severity:
        labels["severity_label"] = severity  # kept, not lost: our severities are info, warning, critical
    if cat != category:
        labels["category_label"] = category
    until = ends if ends is not None else now + timedelta(seconds=resolve_timeout_s)
    return f"amv2-raised-{fp}-{stamp}-{int(until.timestamp() * 1000)}", AlertRaised(
        fingerprint=fp, rule=rule, severity=sev, category=cat, summary=summary, labels=labels,
        annotations=annotations, starts_at=starts, ends_at=until)


def status(config_text: str, started_at: datetime, version: str) -> dict[str, Any]:
    return {
        "cluster": {"name": "whaleflux-alerting", "status": "disabled", "peers": []},
        "versionInfo": {"version": version, "revision": "", "branch": "", "buildUser": "whaleflux",
                        "buildDate": "", "goVersion": "none (WhaleFlux alerting)"},
        "config": {"original": config_text},
        "uptime": ts(started_at),
    }
