"""Aggregation groups: the timing of notifications (group_wait, group_interval, repeat_interval).

An alert lands in one group per matching route, keyed by the route and the
values of its `group_by` labels. A group first notifies `group_wait` after it
was created, then at most every `group_interval` when its alerts changed, and
again every `repeat_interval` while something fires unacknowledged. Silenced
and inhibited alerts are left out of a notification; resolved alerts are sent
only to groups that were told they fired. Pure: the caller passes `now` and
persists `groups`.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from .inhibit import InhibitRule, inhibited
from .route import Route
from .silences import Silence, silenced_by


class GroupedAlert(BaseModel):
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime
    ends_at: datetime | None = None
    acknowledged: bool = False
    expires_at: datetime | None = Field(None, description="it resolves by itself then unless raised again "
                                        "(Alertmanager's endsAt of an alert posted to /api/v2/alerts)")

    @property
    def firing(self) -> bool:
        return self.ends_at is None


class Group(BaseModel):
    key: str
    route_id: str
    receiver: str
    group_labels: dict[str, str]
    alerts: dict[str, GroupedAlert] = Field(default_factory=dict)
    next_flush: datetime
    last_notified: datetime | None = None
    notified_firing: list[str] = Field(default_factory=list)
    ack_sent: bool = False
    seq: int = 0
    escalate: bool = Field(False, description="a critical alert escalated its incident: page at the next flush")
    escalations: int = Field(0, description="escalations notified (PagerDuty: one more incident each)")


class NotifiedAlert(BaseModel):
    status: Literal["firing", "resolved"]
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None = None


class Notification(BaseModel):
    """One message for one receiver about one group; `id` is stable, so a retry is the same message."""

    id: str
    receiver: str
    group_key: str
    group_labels: dict[str, str]
    status: Literal["firing", "resolved", "acknowledged"]
    alerts: list[NotifiedAlert]
    created_at: datetime
    repeat: bool = False
    title: str = Field("", description="the incident's title, filled in by the service")
    escalation: bool = Field(False, description="it pages for a critical alert that escalated an open incident")
    escalations: int = Field(0, description="the group's escalations so far, this one included")
    group_path: str = Field("{}", description="the route's matchers from the root, as Alertmanager's groupKey")


def group_key(route: Route, labels: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(the group's key, its group labels: the route's `group_by` labels the alert has, as Alertmanager)."""
    values = {k: labels[k] for k in route.group_by if labels.get(k)}
    canon = route.id + "\x00" + "\x00".join(f"{k}={v}" for k, v in sorted(values.items()))
    return hashlib.sha256(canon.encode()).hexdigest()[:20], values


class Dispatcher:
    def __init__(self, route: Route, inhibit_rules: list[InhibitRule], groups: dict[str, Group] | None = None):
        self.route = route
        self.inhibit_rules = inhibit_rules
        self.groups: dict[str, Group] = groups or {}

    def firing_labels(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for g in self.groups.values():
            for a in g.alerts.values():
                if a.firing:
                    out[a.fingerprint] = a.labels
        return out

    def add(self, alert: GroupedAlert, now: datetime) -> list[str]:
        """Put a firing or resolved alert into its groups; return the keys of the groups changed."""
        changed = []
        for route in self.route.match(alert.labels):
            key, values = group_key(route, alert.labels)
            group = self.groups.get(key)
            if group is None:
                if not alert.firing:
                    continue  # resolved before it was ever grouped: nothing to tell
                group = Group(key=key, route_id=route.id, receiver=route.receiver, group_labels=values,
                              next_flush=now + timedelta(seconds=route.group_wait_s))
                self.groups[key] = group
            old = group.alerts.get(alert.fingerprint)
            if old is not None and not alert.firing and not old.firing:
                continue
            if old is not None and alert.firing and old.firing and old.starts_at == alert.starts_at:
                # A redelivered raise changes nothing; a re-sent one with a later end extends it.
                if alert.expires_at != old.expires_at or alert.annotations != old.annotations:
                    group.alerts[alert.fingerprint] = old.model_copy(
                        update={"expires_at": alert.expires_at, "annotations": alert.annotations})
                    changed.append(key)
                continue
            if not alert.firing and old is None:
                continue
            keep_ack = old.acknowledged if (old is not None and alert.firing) else False
            group.alerts[alert.fingerprint] = alert.model_copy(update={"acknowledged": keep_ack or alert.acknowledged})
            changed.append(key)
        return changed

    def escalate(self, keys: list[str], now: datetime) -> None:
        """These groups page now (not at their next group_interval): a critical alert escalated the incident."""
        for key in keys:
            g = self.groups.get(key)
            if g is not None:
                g.escalate = True
                g.next_flush = min(g.next_flush, now)

    def acknowledge(self, fingerprint: str) -> list[str]:
        changed = []
        for g in self.groups.values():
            a = g.alerts.get(fingerprint)
            if a is not None and a.firing and not a.acknowledged:
                g.alerts[fingerprint] = a.model_copy(update={"acknowledged": True})
                changed.append(g.key)
        return changed

    def next_due(self) -> datetime | None:
        """When the next group flushes or the next alert reaches its end."""
        ends = [a.expires_at for g in self.groups.values() for a in g.alerts.values() if a.firing and a.expires_at]
        return min([g.next_flush for g in self.groups.values()] + ends, default=None)

    def expire(self, now: datetime) -> tuple[list[str], list[str]]:
        """Resolve the alerts whose end has come (at their end); (their fingerprints, the groups changed). A group
        that was told they fired hears them resolved at its next flush, which is now."""
        expired, changed = [], []
        for key, g in self.groups.items():
            for fp, a in list(g.alerts.items()):
                if a.firing and a.expires_at is not None and a.expires_at <= now:
                    g.alerts[fp] = a.model_copy(update={"ends_at": a.expires_at})
                    g.next_flush = min(g.next_flush, now)
                    expired.append(fp)
                    changed.append(key)
        return sorted(set(expired)), sorted(set(changed))

    def grouped(self, fingerprint: str) -> GroupedAlert | None:
        """The alert as some group holds it (labels with its incident), or None."""
        for g in self.groups.values():
            a = g.alerts.get(fingerprint)
            if a is not None:
                return a
        return None

    def flush(self, now: datetime, silences: list[Silence]) -> tuple[list[Notification], list[str], list[str]]:
        """Notifications due at `now`; also the keys of groups changed and of groups removed."""
        out: list[Notification] = []
        changed, removed = [], []
        firing = self.firing_labels()

        def muted(a: GroupedAlert) -> bool:
            return bool(silenced_by(a.labels, silences, now)) or inhibited(a.labels, a.fingerprint, firing,
                                                                            self.inhibit_rules)

        for key, g in list(self.groups.items()):
            if now < g.next_flush:
                continue
            route = self.route.find(g.route_id)
            note = _flush_group(g, [a for a in g.alerts.values() if a.firing and not muted(a)], now,
                                route.repeat_interval_s if route else 4 * 3600.0)
            if note is not None and route is not None:
                note.group_path = route.path
            if note is not None:
                out.append(note)
            for a in [a for a in g.alerts.values() if not a.firing]:
                g.alerts.pop(a.fingerprint)
                if a.fingerprint in g.notified_firing:
                    g.notified_firing.remove(a.fingerprint)
            g.next_flush = now + timedelta(seconds=route.group_interval_s if route else 300.0)
            if not g.alerts:
                del self.groups[key]
                removed.append(key)
            else:
                changed.append(key)
        return out, changed, removed


def _flush_group(g: Group, live: list[GroupedAlert], now: datetime, repeat_s: float) -> Notification | None:
    """What a due group says: a change, a repeat, an acknowledgement, or nothing."""
    resolved = [a for a in g.alerts.values() if not a.firing and a.fingerprint in g.notified_firing]
    live_fps = sorted(a.fingerprint for a in live)
    is_change = live_fps != sorted(g.notified_firing) and bool(live_fps or resolved) or bool(resolved)
    unacked = [a for a in live if not a.acknowledged]
    is_repeat = (
        not is_change and bool(unacked) and g.last_notified is not None
        and (now - g.last_notified).total_seconds() >= repeat_s
    )
    if is_change or is_repeat:
        g.seq += 1
        alerts = [_notified(a, "firing") for a in sorted(live, key=lambda a: a.starts_at)]
        alerts += [_notified(a, "resolved") for a in sorted(resolved, key=lambda a: a.starts_at)]
        g.notified_firing = live_fps
        g.last_notified = now
        if is_change:
            g.ack_sent = False
        escalation = g.escalate and is_change and bool(live)
        g.escalations += escalation
        g.escalate = False
        return Notification(id=f"{g.key}-{g.seq}", receiver=g.receiver, group_key=g.key, group_labels=g.group_labels,
                            status="firing" if live else "resolved", alerts=alerts, created_at=now, repeat=is_repeat,
                            escalation=escalation, escalations=g.escalations)
    if live and not unacked and not g.ack_sent and g.notified_firing:
        g.seq += 1
        g.ack_sent = True
        return Notification(id=f"{g.key}-{g.seq}", receiver=g.receiver, group_key=g.key, group_labels=g.group_labels,
                            status="acknowledged", alerts=[_notified(a, "firing") for a in live], created_at=now,
                            escalations=g.escalations)
    return None


def _notified(a: GroupedAlert, status: Literal["firing", "resolved"]) -> NotifiedAlert:
    return NotifiedAlert(status=status, fingerprint=a.fingerprint, labels=a.labels, annotations=a.annotations,
                         starts_at=a.starts_at, ends_at=a.ends_at)
