"""Incidents: alerts that belong together become one.

The same rule on many GPUs of one pool within a window, or a hot node and its
throttling neighbours in one rack, is one incident: the first matching
correlation decides the key (its `by` labels); an alert joins the open incident
with that key, else opens a new one. An incident stays open while any member
fires and for `window` after its last activity; with `join: within_window` a new
alert joins it by key only within `window` of its last new member. Before the key, an alert that shares a
`join_on` label (UUID: the same GPU) with a firing member of an open incident
joins that incident.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .matchers import matches_all

if TYPE_CHECKING:
    from ..config import IncidentsConfig


class Member(BaseModel):
    alertname: str
    node: str = ""
    firing: bool = True
    join: dict[str, str] = Field(default_factory=dict, description="values of the `join_on` labels")


class Incident(BaseModel):
    id: str
    key: str
    correlation: str
    by: dict[str, str]
    title_template: str
    opened_at: datetime
    last_at: datetime
    joined_at: datetime | None = Field(None, description="when the last member joined (None: as last_at)")
    join: str = Field("while_firing", description="how new alerts with its key join: while_firing, within_window")
    members: dict[str, Member] = Field(default_factory=dict)
    drained_nodes: list[str] = Field(default_factory=list)

    def firing_count(self) -> int:
        return sum(1 for m in self.members.values() if m.firing)

    def title(self) -> str:
        names = sorted({m.alertname for m in self.members.values()})
        nodes = sorted({m.node for m in self.members.values() if m.node})
        # `count`: GPUs (several alerts of one GPU count once), or alerts that name no GPU.
        things = {m.join.get("UUID") or fp for fp, m in self.members.items()}
        values = {**self.by, "count": len(things), "alerts": len(self.members), "alertnames": ", ".join(names),
                  "nodes": ", ".join(nodes)}
        try:
            return self.title_template.format_map(_Missing(values))
        except (ValueError, IndexError):
            return self.title_template

    def is_open(self, now: datetime, window_s: float) -> bool:
        return self.firing_count() > 0 or (now - self.last_at).total_seconds() < window_s

    def accepts(self, now: datetime, window_s: float) -> bool:
        """Whether a new alert with this incident's key joins it: while it is open, and for `within_window`
        correlations only within the window after its last new member."""
        if not self.is_open(now, window_s):
            return False
        if self.join == "within_window":
            return (now - (self.joined_at or self.last_at)).total_seconds() < window_s
        return True


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


class Correlator:
    """Assigns alerts to incidents; the caller persists `incidents` and passes time in."""

    def __init__(self, config: IncidentsConfig, incidents: dict[str, Incident] | None = None):
        self.config = config
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
        join = {k: labels[k] for k in self.config.join_on if labels.get(k)}
        window = self.config.window
        # Another symptom of something already in an open incident (the same GPU: an ECC error and its
        # remapped row, XID 48 and the ECC count) joins that incident, whatever its correlation.
        incident = next(
            (i for i in self.incidents.values() if join and i.is_open(now, window)
             and any(m.firing and any(m.join.get(k) == v for k, v in join.items()) for m in i.members.values())),
            None,
        )
        if incident is None:
            correlation, by, mode = "single", {"fingerprint": fingerprint}, "while_firing"
            template = "{alertnames} on {nodes}"
            for corr in self.config.correlate:
                if matches_all(corr.matchers, labels) and all(labels.get(k) for k in corr.by):
                    correlation, by, template, mode = corr.name, {k: labels[k] for k in corr.by}, corr.title, corr.join
                    break
            key = correlation + "\x00" + "\x00".join(f"{k}={v}" for k, v in sorted(by.items()))
            incident = next((i for i in self.incidents.values() if i.key == key and i.accepts(now, window)), None)
        if incident is None:
            iid = "inc-" + hashlib.sha256(f"{key}\x00{now.isoformat()}".encode()).hexdigest()[:12]
            incident = Incident(id=iid, key=key, correlation=correlation, by=by, title_template=template,
                                opened_at=now, last_at=now, join=mode)
            self.incidents[iid] = incident
        incident.members[fingerprint] = Member(alertname=labels.get("alertname", ""), node=labels.get("Hostname", ""),
                                               join=join)
        incident.last_at = incident.joined_at = now
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
