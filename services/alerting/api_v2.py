"""Alertmanager's v2 HTTP API on alerting (`/api/v2/...`, api/v2/openapi.yaml), so amtool, Grafana's
Alertmanager data source and Karma work unchanged. The models and conversions are `amv2.py`'s; writes
(posting alerts, adding or expiring silences) need the admin bearer token, as the `/v1` writes do.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import ValidationError

from whaleflux.shared.deps import NowDep, OperatorDep, ViewerDep
from whaleflux.shared.version import __version__

from . import amv2
from .api import ServiceDep
from .dispatch.matchers import Matcher
from .service import Alerting

v2 = APIRouter(prefix="/api/v2", tags=["alertmanager v2"], dependencies=[ViewerDep])
Filters = Annotated[list[str], Query(description='matchers, e.g. alertname="GPUXidDrain"')]


def _filters(filters: list[str], receiver: str | None) -> tuple[list[Matcher], re.Pattern[str] | None]:
    try:
        matchers = amv2.parse_filters(filters)
    except ValueError as exc:
        raise HTTPException(400, f"filter: {exc}") from None
    try:
        return matchers, re.compile(receiver) if receiver else None
    except (re.error, RecursionError, OverflowError) as exc:  # "((((...": RecursionError; a{4294967296}: Overflow
        raise HTTPException(400, f"receiver: bad regex: {exc}") from None


def _alerts(svc: Alerting, now: Any) -> dict[str, dict[str, Any]]:
    """Every firing alert the groups hold, as gettableAlert, by fingerprint (its receivers: its groups')."""
    dispatcher = svc.intake.dispatcher
    firing = dispatcher.firing_labels()
    receivers: dict[str, set[str]] = {}
    alerts = {}
    for g in dispatcher.groups.values():
        for a in g.alerts.values():
            if a.firing:
                receivers.setdefault(a.fingerprint, set()).add(g.receiver)
                alerts[a.fingerprint] = a
    out = {}
    for fp, a in alerts.items():
        silenced = svc.intake.silenced_by(a.labels, now)
        inhibited = svc.intake.inhibited_by(a.labels, fp, firing)
        out[fp] = amv2.gettable_alert(a, sorted(receivers[fp]), silenced, inhibited, svc.settings.external_url)
    return out


@v2.get("/status")
async def status(svc: ServiceDep) -> dict[str, Any]:
    try:
        text = svc.settings.rules_path.read_text()
    except OSError:
        text = ""
    return amv2.status(text, svc.started_at, f"whaleflux-{__version__}")


@v2.get("/receivers")
async def receivers(svc: ServiceDep) -> list[dict[str, str]]:
    return [{"name": r.name} for r in svc.config.receivers]


@v2.get("/alerts")
async def get_alerts(svc: ServiceDep, now: NowDep, filter: Filters = [],  # noqa: A002, B006 (the API's names)
                     receiver: str | None = None, active: bool = True, silenced: bool = True,
                     inhibited: bool = True, unprocessed: bool = True) -> list[dict[str, Any]]:
    matchers, recv = _filters(filter, receiver)
    alerts = sorted(_alerts(svc, now).values(), key=lambda a: (a["startsAt"], a["fingerprint"]))
    return [a for a in alerts if amv2.wanted(a, matchers, recv, active, silenced, inhibited)]


@v2.post("/alerts", dependencies=[OperatorDep])
async def post_alerts(body: list[amv2.PostableAlert], svc: ServiceDep, now: NowDep) -> None:
    """Alerts from Prometheus (or any Alertmanager client): published as alert.raised / alert.resolved, so
    they are grouped, silenced, inhibited and routed as WhaleFlux's own."""
    timeout = svc.settings.alerting_resolve_timeout_s
    await svc.publish_alerts([amv2.alert_event(a, now, timeout) for a in body])


@v2.get("/alerts/groups")
async def get_groups(svc: ServiceDep, now: NowDep, filter: Filters = [],  # noqa: A002, B006
                     receiver: str | None = None, active: bool = True, silenced: bool = True,
                     inhibited: bool = True, muted: bool = True) -> list[dict[str, Any]]:
    matchers, recv = _filters(filter, receiver)
    alerts = _alerts(svc, now)
    out = []
    for g in sorted(svc.intake.dispatcher.groups.values(), key=lambda g: g.key):
        if recv is not None and not recv.fullmatch(g.receiver):
            continue
        members = [alerts[a.fingerprint] for a in g.alerts.values() if a.firing and a.fingerprint in alerts]
        members = [a for a in members if amv2.wanted(a, matchers, None, active, silenced, inhibited)]
        if members:
            out.append({"labels": g.group_labels, "routeLabels": {}, "receiver": {"name": g.receiver},
                        "alerts": members})
    return out


@v2.get("/silences")
async def get_silences(svc: ServiceDep, now: NowDep, filter: Filters = []) -> list[dict[str, Any]]:  # noqa: A002, B006
    matchers, _ = _filters(filter, None)
    out = []
    for s in sorted(svc.intake.silences.values(), key=lambda s: s.starts_at):
        if all(any(m.name == x.name and m.op == x.op and m.value == x.value for x in s.parsed()) for m in matchers):
            out.append(amv2.gettable_silence(s, now))
    return out


@v2.post("/silences", dependencies=[OperatorDep])
async def post_silence(body: amv2.PostableSilence, svc: ServiceDep, now: NowDep) -> dict[str, str]:
    """A new silence, or (with the id of an existing one) that silence changed; 400 naming the field."""
    if body.id and body.id not in svc.intake.silences:
        raise HTTPException(404, f"id: no silence {body.id!r}")
    try:
        silence = amv2.silence_of(body, body.id or secrets.token_hex(8), now)
    except (ValueError, ValidationError) as exc:
        raise HTTPException(400, str(exc).splitlines()[-1]) from None
    await svc.save_silence(silence)
    svc.log.info("silence.created", silence=silence.id, by=silence.created_by, api="v2")
    return {"silenceID": silence.id}


@v2.get("/silence/{silence_id}")
async def get_silence(silence_id: str, svc: ServiceDep, now: NowDep) -> dict[str, Any]:
    s = svc.intake.silences.get(silence_id)
    if s is None:
        raise HTTPException(404, f"silenceID: no silence {silence_id!r}")
    return amv2.gettable_silence(s, now)


@v2.delete("/silence/{silence_id}", dependencies=[OperatorDep])
async def delete_silence(silence_id: str, svc: ServiceDep, now: NowDep) -> None:
    """Expire the silence now (it stays listed as expired)."""
    s = svc.intake.silences.get(silence_id)
    if s is None:
        raise HTTPException(404, f"silenceID: no silence {silence_id!r}")
    await svc.save_silence(s.model_copy(update={"expired_at": now}))
