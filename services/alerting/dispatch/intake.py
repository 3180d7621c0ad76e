"""Alert events (ours and other services') in; groups, incidents, notifications and drain requests out.

The state of notification dispatch in one place: aggregation groups, incidents,
silences and acknowledgements. Each step returns a `Changes` the shell saves in
one MULTI (and then publishes the drain requests). Pure; time passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, Field

from whaleflux.shared import subjects
from whaleflux.shared.events import AlertRaised, AlertResolved, Envelope, NodeDrainRequested, make_envelope

from ..config import AlertingConfig
from .groups import Dispatcher, Group, GroupedAlert, Notification
from .incidents import Correlator, Incident
from .inhibit import InhibitRule, inhibited, inhibitors
from .route import build_route
from .silences import Silence, silenced_by


class Ack(BaseModel):
    """Someone acknowledged a firing alert (its firing since `starts_at`): no more repeats."""

    by: str
    comment: str = ""
    at: datetime
    starts_at: datetime = Field(description="the firing it acknowledges; a later firing is not acknowledged")


@dataclass(frozen=True)
class Outgoing:
    """An event to stage in the outbox with the state change that caused it."""

    subject: str
    envelope: Envelope


@dataclass
class Changes:
    """What one dispatch step changed, to save together."""

    groups: dict[str, Group] = field(default_factory=dict)  # key -> group as it is now
    removed: list[str] = field(default_factory=list)  # group keys
    incidents: list[Incident] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)  # titled with their incident
    drains: list[Outgoing] = field(default_factory=list)


def inhibit_rules(config: AlertingConfig) -> list[InhibitRule]:
    return [InhibitRule(r.source_matchers, r.target_matchers, tuple(r.equal)) for r in config.inhibit_rules]


class Intake:
    def __init__(self, config: AlertingConfig, source: str, groups: dict[str, Group] | None = None,
                 incidents: dict[str, Incident] | None = None, silences: dict[str, Silence] | None = None,
                 acks: dict[str, Ack] | None = None) -> None:
        self.config = config
        self.source = source  # CloudEvents source of the drain requests
        self.dispatcher = Dispatcher(build_route(config.route), inhibit_rules(config), groups)
        self.correlator = Correlator(config.incidents, incidents)
        self.silences: dict[str, Silence] = silences or {}
        self.acks: dict[str, Ack] = acks or {}

    def set_config(self, config: AlertingConfig) -> None:
        self.config = config
        self.correlator.config = config.incidents
        self.dispatcher.route = build_route(config.route)
        self.dispatcher.inhibit_rules = inhibit_rules(config)

    def acked(self, alert: AlertRaised) -> Ack | None:
        """The acknowledgement of this firing of the alert, if any."""
        ack = self.acks.get(alert.fingerprint)
        return ack if ack is not None and ack.starts_at == alert.starts_at else None

    def receive(self, data: AlertRaised | AlertResolved, now: datetime) -> Changes:
        """Group an alert event and say what is due now. A raise whose end has passed (posted with an endsAt in
        the past, or replayed after it) is its resolution."""
        drains: list[Outgoing] = []
        if isinstance(data, AlertRaised) and data.ends_at is not None and data.ends_at <= now:
            data = AlertResolved(fingerprint=data.fingerprint, rule=data.rule, labels=data.labels,
                                 summary=data.summary, starts_at=data.starts_at, ends_at=data.ends_at)
        if isinstance(data, AlertRaised):
            incident: Incident | None
            changed, incident, drains = self._raised(data, now)
        else:
            old = self.dispatcher.grouped(data.fingerprint)
            incident = self.correlator.resolve(data.fingerprint, now)
            changed = [] if old is None else self.dispatcher.add(old.model_copy(update={"ends_at": data.ends_at}), now)
        return self.flush(now, changed, [incident] if incident else [], drains)

    def _raised(self, data: AlertRaised, now: datetime) -> tuple[list[str], Incident, list[Outgoing]]:
        labels = {"alertname": data.rule, "severity": data.severity, "category": data.category, **data.labels}
        incident, escalates = self.correlator.join(data.fingerprint, labels, now, data.summary)
        labels["incident"] = incident.id
        annotations = {"summary": data.summary, **data.annotations}
        if data.value is not None:
            annotations.setdefault("value", f"{data.value:g}")
        alert = GroupedAlert(fingerprint=data.fingerprint, labels=labels, annotations=annotations,
                             starts_at=data.starts_at, acknowledged=self.acked(data) is not None,
                             expires_at=data.ends_at)
        changed = self.dispatcher.add(alert, now)
        if escalates and changed:
            incident.escalations += 1
            self.dispatcher.escalate(changed, now)
        return changed, incident, self._drains(data, incident, now)

    def _drains(self, data: AlertRaised, incident: Incident, now: datetime) -> list[Outgoing]:
        """node.drain_requested when a critical alert's rule asks for it: once per node and cause (this firing
        of this alert), so a second GPU of a node, or the same fault after an undrain, asks again; the event id
        is the request's, so a redelivered alert asks nothing new."""
        rule = self.config.rule(data.rule)
        node, cluster = data.labels.get("Hostname"), data.labels.get("cluster")
        cause = f"{data.fingerprint}-{int(data.starts_at.timestamp() * 1000)}"
        if (rule is None or "drain" not in rule.actions or data.severity != "critical" or not node or not cluster
                or not self.correlator.needs_drain(incident, f"{cluster}/{node}", cause)):
            return []
        drain = NodeDrainRequested(cluster=cluster, node=node, reason=f"{data.rule}: {data.summary}"[:500],
                                   fingerprint=data.fingerprint)
        env = make_envelope(drain, source=self.source, subject=node, event_id=f"drain-{cluster}-{node}-{cause}",
                            correlation_id=data.fingerprint, time=now)
        return [Outgoing(subjects.node_drain_requested(cluster, node), env)]

    def undrained(self, cluster: str, node: str) -> Changes:
        """An operator undrained the node: the incidents forget their drains there (saved with the changes)."""
        return Changes(incidents=self.correlator.undrained(f"{cluster}/{node}"))

    def acknowledge(self, fingerprint: str, ack: Ack, now: datetime) -> Changes:
        """Record an acknowledgement; groups already notified flush now (PagerDuty hears `acknowledge`)."""
        self.acks[fingerprint] = ack
        changed = self.dispatcher.acknowledge(fingerprint)
        for key in changed:
            g = self.dispatcher.groups[key]
            if g.last_notified is not None:
                g.next_flush = min(g.next_flush, now)
        return self.flush(now, changed)

    def flush(self, now: datetime, changed: list[str] | None = None, incidents: list[Incident] | None = None,
              drains: list[Outgoing] | None = None) -> Changes:
        """The notifications due at `now` (alerts that reached their end resolved first), with what changed."""
        expired, ended_groups = self.dispatcher.expire(now)
        ended = [i for i in (self.correlator.resolve(fp, now) for fp in expired) if i is not None]
        changed, incidents = [*(changed or []), *ended_groups], [*(incidents or []), *ended]
        notifications, flushed, removed = self.dispatcher.flush(now, list(self.silences.values()))
        groups = self.dispatcher.groups
        return Changes(
            groups={k: groups[k] for k in {*changed, *flushed} if k in groups},
            removed=removed,
            incidents=list({i.id: i for i in incidents if i.id in self.correlator.incidents}.values()),
            notifications=[n.model_copy(update={"title": self._title(n)}) for n in notifications],
            drains=drains or [],
        )

    def _title(self, n: Notification) -> str:
        inc_id = n.group_labels.get("incident") or next((a.labels.get("incident") for a in n.alerts), None)
        inc = self.correlator.incidents.get(inc_id) if inc_id else None
        title = inc.title() if inc else ""
        return f"Escalation: {title}" if n.escalation and title else title

    def others(self) -> list[AlertRaised]:
        """The firing alerts of other sources (billing's budgets, alerts posted to /api/v2/alerts): their
        alert.raised as the groups hold them, for listing beside our rules' own. An alert named for one of our
        rules is ours (its resolution may still be on its way to the groups), never listed here."""
        out: dict[str, AlertRaised] = {}
        for g in self.dispatcher.groups.values():
            for a in g.alerts.values():
                name = a.labels.get("alertname", "")
                if a.firing and a.fingerprint not in out and self.config.rule(name) is None:
                    out[a.fingerprint] = _as_raised(a)
        return list(out.values())

    def silenced_by(self, labels: dict[str, str], now: datetime) -> list[str]:
        return silenced_by(labels, list(self.silences.values()), now)

    def inhibited_by(self, labels: dict[str, str], fingerprint: str,
                     firing: dict[str, dict[str, str]] | None = None) -> list[str]:
        """The fingerprints of the firing alerts that inhibit this one."""
        return inhibitors(labels, fingerprint, self.dispatcher.firing_labels() if firing is None else firing,
                          self.dispatcher.inhibit_rules)

    def muted(self, labels: dict[str, str], fingerprint: str, now: datetime) -> tuple[list[str], bool]:
        """(ids of the silences muting an alert with these labels, whether a firing alert inhibits it)."""
        firing = self.dispatcher.firing_labels()
        return (silenced_by(labels, list(self.silences.values()), now),
                inhibited(labels, fingerprint, firing, self.dispatcher.inhibit_rules))


_ADDED_LABELS = ("alertname", "severity", "category", "incident")  # what `_raised` put in the labels


def _as_raised(a: GroupedAlert) -> AlertRaised:
    """The alert.raised a grouped alert came from (as `Intake._raised` built it)."""
    notes = {k: v for k, v in a.annotations.items() if k not in ("summary", "value")}
    try:
        value = float(a.annotations["value"]) if "value" in a.annotations else None
    except ValueError:
        value = None
    return AlertRaised.model_validate({
        "fingerprint": a.fingerprint, "rule": a.labels.get("alertname", ""),
        "severity": a.labels.get("severity", "warning"), "category": a.labels.get("category", "health"),
        "summary": a.annotations.get("summary", ""), "labels": {k: v for k, v in a.labels.items()
                                                                if k not in _ADDED_LABELS},
        "annotations": notes, "value": value, "starts_at": a.starts_at, "ends_at": a.expires_at})
