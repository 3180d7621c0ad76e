"""Alerting's HTTP API: alerts, acknowledgements, silences, incidents, the notification log, rules."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field, ValidationError

from whaleflux.shared.deps import AdminDep, NowDep, OperatorDep, ViewerDep
from whaleflux.shared.events import AlertRaised

from .config import parse_duration
from .dispatch.silences import Silence
from .service import Alerting
from .store import LOG_KEEP, AlertStore


def _service(request: Request) -> Alerting:
    service: Alerting = request.app.state.service
    return service


def _store(request: Request) -> AlertStore:
    store: AlertStore = request.app.state.store
    return store


ServiceDep = Annotated[Alerting, Depends(_service)]
StoreDep = Annotated[AlertStore, Depends(_store)]


class AckRequest(BaseModel):
    by: str = Field(min_length=1, max_length=128)
    comment: str = Field("", max_length=1000)


class SilenceRequest(BaseModel):
    matchers: list[str] = Field(min_length=1)
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    duration_s: float | None = Field(None, gt=0, le=365 * 86400)
    duration: str | None = Field(None, description="instead of duration_s: 30m, 2h, 1d")
    created_by: str = Field(min_length=1, max_length=128)
    comment: str = Field(min_length=1, max_length=1000)


alerts = APIRouter(tags=["alerts"], dependencies=[ViewerDep])
silences = APIRouter(tags=["silences"], dependencies=[ViewerDep])
rules = APIRouter(tags=["rules"], dependencies=[ViewerDep])


def _alert_view(svc: Alerting, a: AlertRaised, now: datetime) -> dict[str, Any]:
    intake = svc.intake
    g = intake.dispatcher.grouped(a.fingerprint)
    labels = g.labels if g else {"alertname": a.rule, "severity": a.severity, **a.labels}
    inc = intake.correlator.incident_of(a.fingerprint)
    ack = intake.acked(a)
    silenced, inhibited = intake.muted(labels, a.fingerprint, now)
    return {**a.model_dump(mode="json"), "incident": inc.id if inc else None,
            "acknowledged": ack.model_dump(mode="json") if ack else None, "silenced_by": silenced,
            "inhibited": inhibited}


@alerts.get("/v1/alerts")
async def list_alerts(svc: ServiceDep, now: NowDep) -> list[dict[str, Any]]:
    """Alerts firing now (our rules' and other services', e.g. billing's budgets), oldest first, with incident,
    acknowledgement, silences and inhibition."""
    return [_alert_view(svc, a, now) for a in svc.firing_alerts()]


@alerts.post("/v1/alerts/{fingerprint}/ack", dependencies=[OperatorDep])
async def acknowledge(fingerprint: str, req: AckRequest, svc: ServiceDep) -> dict[str, Any]:
    """Acknowledge a firing alert: no more repeats; PagerDuty receivers get `acknowledge`."""
    ack = await svc.acknowledge(fingerprint, req.by, req.comment)
    if ack is None:
        raise HTTPException(404, f"fingerprint: no firing alert {fingerprint!r}")
    return {"fingerprint": fingerprint, **ack.model_dump(mode="json")}


@alerts.get("/v1/incidents")
async def list_incidents(svc: ServiceDep, now: NowDep) -> list[dict[str, Any]]:
    window = svc.config.incidents.window
    return [{"id": i.id, "title": i.title(), "correlation": i.correlation, "by": i.by, "opened_at": i.opened_at,
             "last_at": i.last_at, "firing": i.firing_count(), "members": len(i.members),
             "open": i.is_open(now, window), "drained_nodes": i.drained_nodes}
            for i in sorted(svc.intake.correlator.incidents.values(), key=lambda i: i.opened_at)]


@alerts.get("/v1/notifications")
async def notifications(
    store: StoreDep,
    receiver: str | None = None,
    status: str | None = Query(None, description="delivered, rejected, failed, skipped, pending"),
    limit: Annotated[int, Query(ge=1, le=LOG_KEEP)] = 100,
) -> list[dict[str, Any]]:
    """The notification log, newest first; `pending` lists what is queued or being retried."""
    if status == "pending":
        rows = [d for d in await store.pending() if receiver is None or d.receiver == receiver]
        return [{"delivery_id": d.id, "receiver": d.receiver, "status": "pending", "attempts": d.attempts,
                 "last_error": d.last_error, "created_at": d.created_at,
                 "notification_status": d.notification.status} for d in rows][:limit]
    out = []
    for e in await store.log_entries():
        if (receiver is None or e.receiver == receiver) and (status is None or e.status == status):
            out.append(e.model_dump(mode="json"))
            if len(out) >= limit:
                break
    return out


@silences.get("/v1/silences")
async def list_silences(svc: ServiceDep, now: NowDep) -> list[dict[str, Any]]:
    return [{**s.model_dump(mode="json"), "state": s.state(now)}
            for s in sorted(svc.intake.silences.values(), key=lambda s: s.starts_at)]


def _silence(req: SilenceRequest, now: datetime) -> Silence:
    """The silence a request asks for; 422 naming the field when it cannot be one."""
    starts = req.starts_at or now
    if starts.tzinfo is None:
        raise HTTPException(422, "starts_at: needs a timezone")
    seconds = req.duration_s
    if req.duration is not None:
        try:
            seconds = parse_duration(req.duration)
        except ValueError as exc:
            raise HTTPException(422, f"duration: {exc}") from None
    if req.ends_at is None and not seconds:
        raise HTTPException(422, "ends_at: give ends_at, duration or duration_s")
    ends = req.ends_at or starts + timedelta(seconds=seconds or 0)
    try:
        return Silence(id=secrets.token_hex(8), matchers=req.matchers, starts_at=starts, ends_at=ends,
                       created_by=req.created_by, comment=req.comment)
    except ValidationError as exc:
        text = str(exc)
        raise HTTPException(422, text.splitlines()[-1] if "\n" in text else text) from None


@silences.post("/v1/silences", dependencies=[OperatorDep], status_code=201)
async def create_silence(req: SilenceRequest, svc: ServiceDep, now: NowDep) -> dict[str, Any]:
    """Mute alerts matching every matcher from `starts_at` (default now) to `ends_at` (or for `duration_s`)."""
    silence = _silence(req, now)
    await svc.save_silence(silence)
    svc.log.info("silence.created", silence=silence.id, by=req.created_by)
    return {**silence.model_dump(mode="json"), "state": silence.state(now)}


@silences.post("/v1/silences/{silence_id}/expire", dependencies=[OperatorDep])
async def expire_silence(silence_id: str, svc: ServiceDep, now: NowDep) -> dict[str, Any]:
    s = svc.intake.silences.get(silence_id)
    if s is None:
        raise HTTPException(404, f"silence_id: no silence {silence_id!r}")
    s = s.model_copy(update={"expired_at": now})
    await svc.save_silence(s)
    return {**s.model_dump(mode="json"), "state": s.state(now)}


@rules.get("/v1/rules")
async def list_rules(svc: ServiceDep) -> dict[str, Any]:
    settings = svc.settings
    return {"file": str(settings.rules_path), "loaded_at": svc.rules_loaded_at.timestamp(),
            "errors": svc.rules_error,
            "rules": [{"name": r.name, "kind": r.kind, "severity": r.severity, "for_s": r.for_s}
                      for r in svc.config.rules],
            "receivers": [{"name": r.name, "type": r.type, "urls": len(svc.directory.urls(r))}
                          for r in svc.config.receivers],
            "guardians": {"rules": [r.name for r in svc.engine.finding_rules],
                          "inventory": {"poll_s": settings.alerting_findings_poll_s, **svc.findings.status}}}


@rules.post("/admin/rules/reload", dependencies=[AdminDep])
async def reload(svc: ServiceDep) -> dict[str, Any]:
    """Re-read the rules file now; 422 with `FILE:LINE: key: problem` lines when it is bad."""
    errors = svc.reload_rules()
    if errors:
        raise HTTPException(422, errors)
    return {"rules": len(svc.config.rules)}


ROUTERS = [alerts, silences, rules]
