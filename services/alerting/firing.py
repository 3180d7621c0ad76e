"""The alerts firing now: rule transitions in, `alert.raised` / `alert.resolved` events out. Pure; time passed in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from whaleflux.shared import subjects
from whaleflux.shared.events import AlertRaised, AlertResolved, Envelope, make_envelope

from .config import RuleBase
from .rules.engine import Transition


@dataclass(frozen=True)
class AlertChange:
    """One alert starts or stops firing: the event to publish and the state to keep."""

    alert: AlertRaised | AlertResolved
    subject: str
    envelope: Envelope

    @property
    def fingerprint(self) -> str:
        return self.alert.fingerprint

    @property
    def raised(self) -> bool:
        return isinstance(self.alert, AlertRaised)


class FiringAlerts:
    """Fingerprint -> the alert.raised of every alert firing now."""

    def __init__(self, source: str, firing: dict[str, AlertRaised] | None = None) -> None:
        self.source = source  # CloudEvents source of the events we publish
        self.alerts: dict[str, AlertRaised] = firing or {}

    def change(self, tr: Transition, now: datetime) -> AlertChange | None:
        """The event a transition makes, or None when it changes nothing (already firing, or not firing)."""
        alert: AlertRaised | AlertResolved
        if tr.firing and tr.fingerprint not in self.alerts and isinstance(tr.rule, RuleBase):
            alert = AlertRaised(fingerprint=tr.fingerprint, rule=tr.rule.name, severity=tr.rule.severity,
                                category=tr.rule.category, summary=tr.summary, labels=tr.labels, value=tr.value,
                                annotations=tr.annotations, starts_at=tr.at)
            kind, subject = "raised", subjects.ALERT_RAISED
        elif not tr.firing and tr.fingerprint in self.alerts:
            was = self.alerts[tr.fingerprint]
            alert = AlertResolved(fingerprint=tr.fingerprint, rule=was.rule, labels=was.labels, summary=tr.summary,
                                  starts_at=was.starts_at, ends_at=max(tr.at, was.starts_at))
            kind, subject = "resolved", subjects.ALERT_RESOLVED
        else:
            return None
        env = make_envelope(alert, source=self.source, subject=tr.fingerprint, correlation_id=tr.fingerprint,
                            event_id=f"{kind}-{tr.fingerprint}-{int(alert.starts_at.timestamp() * 1000)}", time=now)
        return AlertChange(alert, subject, env)

    def commit(self, change: AlertChange) -> None:
        """The change was stored: keep it."""
        if isinstance(change.alert, AlertRaised):
            self.alerts[change.fingerprint] = change.alert
        else:
            self.alerts.pop(change.fingerprint, None)

    def by_start(self) -> list[AlertRaised]:
        return sorted(self.alerts.values(), key=lambda a: a.starts_at)
