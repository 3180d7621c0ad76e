"""Incidents: alerts that belong together become one.

The same rule on many GPUs of one pool within a window, or a hot node and its
throttling neighbours in one rack, is one incident: the first matching
correlation decides the key (its `by` labels); an alert joins the open incident
with that key, else opens a new one. An incident stays open while any member
fires and for `window` after its last activity; with `join: within_window` a new
alert joins it by key only within `window` (or the correlation's own) of its last new member. Before the
key, an alert that shares a `join_on` label (UUID: the same GPU) with a firing member of an open incident
joins that incident.

Levels: the correlations an alert matches are tried in order (rack, then pool):
an alert joins an open incident at the first level at which it correlates with
a member of that incident (the same `by` values, the member matched that
correlation too and, for `while_firing` levels, still fires). An incident
joined at a wider level than its own takes that level's key and title, so two
nodes of one pool in different racks overheating together are one incident,
titled for the pool.

Escalation: a critical alert that joins an existing incident escalates it
unless its GPU already has a critical alert firing there (a new GPU, or a GPU
that so far only warned); the caller pages at once for it and asks for its
remediation.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .matchers import matches_all

if TYPE_CHECKING:
    from ..config import CorrelationConfig, IncidentsConfig


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


class Member(BaseModel):
    alertname: str
    node: str = ""
    firing: bool = True
    join: dict[str, str] = Field(default_factory=dict, description="values of the `join_on` labels")
    severity: str = "warning"
    levels: list[str] = Field(default_factory=list, description="the correlations whose matchers it matched")
    labels: dict[str, str] = Field(default_factory=dict, description="its values of the correlations' `by` labels")
    summary: str = Field("", description="its summary (titles may show the latest firing member's)")

    def gpu(self, fingerprint: str) -> str:
        return self.join.get("UUID") or fingerprint


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
    join_window: float | None = Field(None, description="within_window: seconds (None: the incidents' window)")
    members: dict[str, Member] = Field(default_factory=dict)
    drained_nodes: list[str] = Field(default_factory=list, description="cluster/node asked to drain (shown)")
    drain_requests: list[str] = Field(default_factory=list, description="cluster/node/cause asked for")
    escalations: int = Field(0, description="critical alerts that escalated it after it opened")

    def firing_count(self) -> int:
        return sum(1 for m in self.members.values() if m.firing)

    def title(self) -> str:
        names = sorted({m.alertname for m in self.members.values()})
        nodes = sorted({m.node for m in self.members.values() if m.node})
        # `count`: GPUs (several alerts of one GPU count once), or alerts that name no GPU.
        things = {m.gpu(fp) for fp, m in self.members.items()}
        latest = [m.summary for m in self.members.values() if m.firing] or [m.summary for m in self.members.values()]
        values = {**self.by, "count": len(things), "alerts": len(self.members), "alertnames": ", ".join(names),
                  "nodes": ", ".join(nodes), "node_count": len(nodes), "summary": latest[-1] if latest else ""}
        try:
            return self.title_template.format_map(_Missing(values))
        except (ValueError, IndexError):
            return self.title_template

    def is_open(self, now: datetime, window_s: float) -> bool:
        return self.firing_count() > 0 or (now - self.last_at).total_seconds() < window_s

    def accepts(self, now: datetime, window_s: float, mode: str | None = None,
                join_window_s: float | None = None) -> bool:
        """Whether a new alert with this incident's key joins it: while it is open, and for `within_window`
        correlations (`mode`, `join_window_s`: the level it would join at, default its own) only within the
        window after its last new member."""
        if not self.is_open(now, window_s):
            return False
        if (mode or self.join) == "within_window":
            limit = join_window_s if mode else self.join_window
            return (now - (self.joined_at or self.last_at)).total_seconds() < (limit or window_s)
        return True


def _key(correlation: str, by: dict[str, str]) -> str:
    return correlation + "\x00" + "\x00".join(f"{k}={v}" for k, v in sorted(by.items()))


def _escalates(incident: Incident, fingerprint: str, labels: dict[str, str], gpu: str) -> bool:
    """A critical alert escalates an incident unless its GPU already has a critical alert firing there: a new
    GPU, or a GPU that so far only warned (a higher severity), pages."""
    if labels.get("severity") != "critical":
        return False
    same_gpu = [m for fp, m in incident.members.items() if m.firing and fp != fingerprint and m.gpu(fp) == gpu]
    return all(SEVERITY_RANK.get(m.severity, 1) < SEVERITY_RANK["critical"] for m in same_gpu)


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
        """The incident of a firing alert: its existing one, an open one it correlates with, or a new one."""
        return self.join(fingerprint, labels, now)[0]

    def join(self, fingerprint: str, labels: dict[str, str], now: datetime,
             summary: str = "") -> tuple[Incident, bool]:
        """(the incident of a firing alert, whether it escalates that incident: see the module's docstring)."""
        window = self.config.window
        current = self.incident_of(fingerprint)
        if current is not None and current.is_open(now, window):
            member = current.members[fingerprint]
            if member.firing:
                return current, False
            escalates = _escalates(current, fingerprint, labels, member.gpu(fingerprint))
            current.members.pop(fingerprint)  # firing again: the latest member (the title's summary)
            current.members[fingerprint] = member.model_copy(update={"firing": True, "summary": summary})
            current.last_at = now
            return current, escalates
        join = {k: labels[k] for k in self.config.join_on if labels.get(k)}
        # Another symptom of something already in an open incident (the same GPU: an ECC error and its
        # remapped row, XID 48 and the ECC count) joins that incident, whatever its correlation.
        incident = next(
            (i for i in self.incidents.values() if join and i.is_open(now, window)
             and any(m.firing and any(m.join.get(k) == v for k, v in join.items()) for m in i.members.values())),
            None,
        )
        levels = [c for c in self.config.correlate
                  if matches_all(c.matchers, labels) and all(labels.get(k) for k in c.by)]
        if incident is None:
            incident = self._correlated(levels, labels, now)
        escalates = incident is not None and _escalates(incident, fingerprint, labels, join.get("UUID") or fingerprint)
        if incident is None:
            incident = self._open(fingerprint, levels, labels, now)
        by_keys = {k for c in self.config.correlate for k in c.by}
        incident.members[fingerprint] = Member(
            alertname=labels.get("alertname", ""), node=labels.get("Hostname", ""), join=join,
            severity=labels.get("severity", "warning"), levels=[c.name for c in levels],
            labels={k: labels[k] for k in by_keys if labels.get(k)}, summary=summary)
        incident.last_at = incident.joined_at = now
        self._by_fp[fingerprint] = incident.id
        return incident, escalates

    def _correlated(self, levels: list[CorrelationConfig], labels: dict[str, str], now: datetime) -> Incident | None:
        """The open incident the alert correlates with at the narrowest level, widened to that level."""
        window = self.config.window
        for corr in levels:
            by = {k: labels[k] for k in corr.by}
            key = _key(corr.name, by)
            for inc in self.incidents.values():
                if not inc.accepts(now, window, corr.join, corr.window):
                    continue
                if inc.key == key:
                    return inc
                # Another level's incident that holds an alert correlating with this one at this level (a firing
                # one, for while_firing levels: a rack joins while it is hot).
                if any((m.firing or corr.join == "within_window") and corr.name in m.levels
                       and all(m.labels.get(k) == v for k, v in by.items()) for m in inc.members.values()):
                    if self._rank(corr.name) > self._rank(inc.correlation):  # wider: the incident takes that level
                        inc.key, inc.correlation, inc.by = key, corr.name, by
                        inc.title_template, inc.join, inc.join_window = corr.title, corr.join, corr.window
                    return inc
        return None

    def _rank(self, correlation: str) -> int:
        names = [c.name for c in self.config.correlate]
        return names.index(correlation) if correlation in names else -1

    def _open(self, fingerprint: str, levels: list[CorrelationConfig], labels: dict[str, str],
              now: datetime) -> Incident:
        join_window = None
        if levels:
            corr = levels[0]
            correlation, by, template, mode = corr.name, {k: labels[k] for k in corr.by}, corr.title, corr.join
            join_window = corr.window
        else:
            # An alert of a node is titled by rule and node; one of no node (a budget, an alert posted to
            # /api/v2) by rule and its summary.
            template = "{alertnames} on {nodes}" if labels.get("Hostname") else "{alertnames}: {summary}"
            correlation, by, mode = "single", {"fingerprint": fingerprint}, "while_firing"
        key = _key(correlation, by)
        iid = "inc-" + hashlib.sha256(f"{key}\x00{now.isoformat()}".encode()).hexdigest()[:12]
        incident = Incident(id=iid, key=key, correlation=correlation, by=by, title_template=template,
                            opened_at=now, last_at=now, join=mode, join_window=join_window)
        self.incidents[iid] = incident
        return incident

    def resolve(self, fingerprint: str, now: datetime) -> Incident | None:
        incident = self.incident_of(fingerprint)
        if incident is None or fingerprint not in incident.members:
            return None
        incident.members[fingerprint] = incident.members[fingerprint].model_copy(update={"firing": False})
        incident.last_at = now
        return incident

    def needs_drain(self, incident: Incident, node: str, cause: str = "") -> bool:
        """True once per node and cause (an alert's firing) per incident: the caller publishes
        node.drain_requested and persists the mark. A new cause on a drained node asks again (the node may
        have been undrained since; the scheduler ignores a request for a node that is draining)."""
        mark = f"{node}/{cause}"
        if not node or mark in incident.drain_requests or (not cause and node in incident.drained_nodes):
            return False
        incident.drain_requests.append(mark)
        if node not in incident.drained_nodes:
            incident.drained_nodes.append(node)
        return True

    def undrained(self, node: str) -> list[Incident]:
        """An operator undrained `cluster/node`: forget what the incidents did there (a later cause drains
        again). Returns the incidents changed, to persist."""
        changed = []
        for inc in self.incidents.values():
            if node in inc.drained_nodes:
                inc.drained_nodes.remove(node)
                inc.drain_requests = [m for m in inc.drain_requests if not m.startswith(node + "/")]
                changed.append(inc)
        return changed

    def expire(self, now: datetime) -> list[str]:
        """Forget closed incidents; return their ids."""
        closed = [iid for iid, inc in self.incidents.items() if not inc.is_open(now, self.config.window)]
        for iid in closed:
            for fp in self.incidents.pop(iid).members:
                if self._by_fp.get(fp) == iid:
                    self._by_fp.pop(fp)
        return closed
