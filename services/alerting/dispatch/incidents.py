"""Incidents: alerts that belong together become one.

The same rule on many GPUs of one pool within a window, or a hot node and its
throttling neighbours in one rack, is one incident: the first matching
correlation decides the key (its `by` labels); an alert joins the open incident
with that key, else opens a new one. An incident stays open while any member
fires and for `window` after its last activity.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from pydantic import BaseModel, Field

from .matchers import matches_all


class Member(BaseModel):
    alertname: str
    node: str = ""
    firing: bool = True


class Incident(BaseModel):
    id: str
    key: str
    correlation: str
    by: dict[str, str]
    title_template: str
    opened_at: datetime
    last_at: datetime
    members: dict[str, Member] = Field(default_factory=dict)
    drained_nodes: list[str] = Field(default_factory=list)

    def firing_count(self) -> int:
        return sum(1 for m in self.members.values() if m.firing)

    def title(self) -> str:
        names = sorted({m.alertname for m in self.members.values()})
        nodes = sorted({m.node for m in self.members.values() if m.node})
        values = {**self.by, "count": len(self.members), "alertnames": ", ".join(names), "nodes": ", ".join(nodes)}
        try:
            return self.title_template.format_map(_Missing(values))
        except (ValueError, IndexError):
            return self.title_template

    def is_open(self, now: datetime, window_s: float) -> bool:
        return self.firing_count() > 0 or (now - self.last_at).total_seconds() < window_s


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


class Correlator:
    """Assigns alerts to incidents; the caller persists `incidents` and passes time in."""

    def __init__(self, config, incidents: dict[str, Incident] | None = None):
        self.config = config  # config.IncidentsConfig
        self.incidents: dict[str, Incident] = incidents or {}
        self._by_fp: dict[str, str] = {fp: inc.id for inc in self.incidents.values() for fp in inc.members}

    def incident_of(self, fingerprint: str) -> Incident | None:
        iid = self._by_fp.get(fingerprint)
        return self.incidents.get(iid) if iid else None

    def assign(self, fingerprint: str, labels: dict[str, str], now: datetime) -> Incident:
        """The incident of a firing alert: its existing one, an open one with the same key, or a new one."""
        current = self.incident_of(fingerprint)
        if current is not None and current.is_open(now, self.config.window):
            member = current.members[fingerprint]
            if not member.firing:
                current.members[fingerprint] = member.model_copy(update={"firing": True})
                current.last_at = now
            return current
        correlation, by = "single", {"fingerprint": fingerprint}
        template = "{alertnames} on {nodes}"
        for corr in self.config.correlate:
            if matches_all(corr.matchers, labels) and all(labels.get(k) for k in corr.by):
                correlation, by, template = corr.name, {k: labels[k] for k in corr.by}, corr.title
                break
        key = correlation + "\x00" + "\x00".join(f"{k}={v}" for k, v in sorted(by.items()))
        incident = next(
            (i for i in self.incidents.values() if i.key == key and i.is_open(now, self.config.window)), None
        )
        if incident is None:
            iid = "inc-" + hashlib.sha256(f"{key}\x00{now.isoformat()}".encode()).hexdigest()[:12]
            incident = Incident(id=iid, key=key, correlation=correlation, by=by, title_template=template,
                                opened_at=now, last_at=now)
            self.incidents[iid] = incident
        incident.members[fingerprint] = Member(alertname=labels.get("alertname", ""), node=labels.get("Hostname", ""))
        incident.last_at = now
        self._by_fp[fingerprint] = incident.id
        return incident

    def resolve(self, fingerprint: str, now: datetime) -> Incident | None:
        incident = self.incident_of(fingerprint)
        if incident is None or fingerprint not in incident.members:
            return None
        incident.members[fingerprint] = incident.members[fingerprint].model_copy(update={"firing": False})
        incident.last_at = now
        return incident

    def needs_drain(self, incident: Incident, node: str) -> bool:
        """True once per node per incident: the caller publishes node.drain_requested and persists the mark."""
        if not node or node in incident.drained_nodes:
            return False
        incident.drained_nodes.append(node)
        return True

    def expire(self, now: datetime) -> list[str]:
        """Forget closed incidents; return their ids."""
        closed = [iid for iid, inc in self.incidents.items() if not inc.is_open(now, self.config.window)]
        for iid in closed:
            for fp in self.incidents.pop(iid).members:
                if self._by_fp.get(fp) == iid:
                    self._by_fp.pop(fp)
        return closed
