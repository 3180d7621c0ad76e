"""Alerting service: evaluates rules on live telemetry and events, groups alerts into incidents, notifies receivers.

Three steps, each crash-safe on its own:
1. rules (`rules/engine.py`) turn samples, heartbeats and events into firing and
   resolved transitions; each is one Redis MULTI with its `alert.raised` /
   `alert.resolved` outbox entry;
2. `alerting-notify` consumes the ALERTS stream (ours and other services'),
   assigns incidents, groups and times notifications (`dispatch/`), and in one
   MULTI saves the groups and queues the deliveries (and `node.drain_requested`
   when a rule asks for it, once per node per incident);
3. the delivery loop POSTs queued deliveries, retrying with back-off for as long
   as `WHALEFLUX_ALERTING_DELIVERY_MAX_AGE_S`, and records each outcome in the
   notification log.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated

import httpx
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, Field, field_validator

from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import (
    AlertRaised,
    AlertResolved,
    Envelope,
    GpuTelemetry,
    JobFailed,
    JobFinished,
    JobRejected,
    JobSubmitted,
    NodeDrainRequested,
    NodeHeartbeat,
    NodeRegistered,
    make_envelope,
)
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from .config import DEFAULT_RULES_FILE, AlertingConfig, ConfigError, ReceiverConfig, load_config, parse_duration
from .dispatch.groups import Dispatcher, Group, GroupedAlert, Notification
from .dispatch.incidents import Correlator, Incident
from .dispatch.inhibit import InhibitRule, inhibited
from .dispatch.route import build_route
from .dispatch.silences import Silence, silenced_by
from .notify import DeliveryError
from .receivers import BUILDERS, WANTS_ACK
from .receivers.delivery import Delivery, LogEntry, TokenBucket, backoff_s
from .rules.engine import NodeInfo, RuleEngine, Transition

LOG_KEEP = 10_000
# Registrations and heartbeats older than this (a replay) give topology, not liveness.
LIVENESS_HORIZON_S = 3600.0


class AlertingSettings(CommonSettings):
    http_port: int = 8703
    # Comma-separated webhook URLs for the `default` receiver; they may embed tokens, so they are never logged.
    alerting_webhook_urls: str = ""
    alerting_rules_file: str | None = Field(None, description="rules, routes, receivers (YAML); re-read when it changes")
    alerting_delivery_max_age_s: float = Field(86400.0, gt=0, description="keep retrying a delivery this long")
    alerting_tick_s: float = Field(0.25, gt=0, le=5)
    external_url: str = Field("http://127.0.0.1:8703", description="this service's URL, put in payloads")
    # Cost guardians (`kind: finding` rules) poll inventory's findings over HTTP.
    inventory_url: str = Field("http://127.0.0.1:8705", description="inventory service, for GET /v1/findings")
    alerting_findings_poll_s: float = Field(300.0, gt=0, description="how often cost guardians poll inventory")

    @field_validator("alerting_webhook_urls")
    @classmethod
    def _urls(cls, value: str) -> str:
        for url in filter(None, (u.strip() for u in value.split(","))):
            if not url.startswith(("http://", "https://")):
                raise ValueError("WHALEFLUX_ALERTING_WEBHOOK_URLS: each URL must start with http:// or https://")
        return value

    @property
    def webhook_urls(self) -> list[str]:
        return [u.strip() for u in self.alerting_webhook_urls.split(",") if u.strip()]

    @property
    def rules_path(self) -> Path:
        return Path(self.alerting_rules_file) if self.alerting_rules_file else DEFAULT_RULES_FILE


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


class AlertingService(ServiceBase):
    name = "alerting"

    def __init__(self, settings: AlertingSettings, **kw):
        super().__init__(settings, **kw)
        self.settings: AlertingSettings = settings
        self.models = gpu_models()
        self._firing: dict[str, AlertRaised] = {}
        self.http: httpx.AsyncClient | None = None
        self.config = load_config(settings.rules_path)  # a bad file at start-up stops the service, naming the line
        self.rules_loaded_at = time.time()
        self.rules_error: list[str] = []
        self._rules_stamp = self._stamp()
        self.engine = RuleEngine(self.config, self.models)
        self.correlator = Correlator(self.config.incidents)
        self.dispatcher = Dispatcher(build_route(self.config.route), self._inhibit_rules(self.config))
        self.silences: dict[str, Silence] = {}
        self.acks: dict[str, dict] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.findings_status: dict = {"ok_at": None, "error": None, "error_at": None, "findings": 0}

    def consumers(self):
        return {
            "alerting-telemetry": self.on_telemetry,
            "alerting-notify": self.on_alert,
            "alerting-nodes": self.on_node,
            "alerting-jobs": self.on_event,
            "alerting-leases": self.on_event,
        }

    def background(self):
        return [self._tick_loop, self._delivery_loop, self._reload_loop, self._findings_loop]

    @property
    def k(self):
        p = self.prefix
        return {
            "firing": f"{p}:firing", "groups": f"{p}:groups", "incidents": f"{p}:incidents",
            "silences": f"{p}:silences", "acks": f"{p}:acks", "queue": f"{p}:deliveries",
            "delivery": f"{p}:delivery", "log": f"{p}:notifications", "topology": f"{p}:topology",
            "job_classes": f"{p}:job-classes",
        }

    async def on_ready(self) -> None:
        self.http = httpx.AsyncClient()
        k, now = self.k, self.clock()
        raw = await self.redis.hgetall(k["firing"])
        self._firing = {fp: AlertRaised.model_validate_json(v) for fp, v in raw.items()}
        for fp, a in self._firing.items():
            self.engine.restore_firing(fp, a.rule, a.labels, a.starts_at, now)
        for key, v in (await self.redis.hgetall(k["topology"])).items():
            cluster, node = key.split("/", 1)
            self.engine.observe_node(cluster, node, NodeInfo(**json.loads(v)), datetime.fromtimestamp(0, now.tzinfo))
        self.dispatcher.groups = {g: Group.model_validate_json(v) for g, v in (await self.redis.hgetall(k["groups"])).items()}
        incidents = {i: Incident.model_validate_json(v) for i, v in (await self.redis.hgetall(k["incidents"])).items()}
        self.correlator = Correlator(self.config.incidents, incidents)
        self.silences = {i: Silence.model_validate_json(v) for i, v in (await self.redis.hgetall(k["silences"])).items()}
        self.acks = {fp: json.loads(v) for fp, v in (await self.redis.hgetall(k["acks"])).items()}
        for job_id, cls in (await self.redis.hgetall(k["job_classes"])).items():
            self.engine.observe_job(job_id, cls)
        await self.publish_staged()

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        await super().stop()

    # ---------------------------------------------------------------- configuration

    @staticmethod
    def _inhibit_rules(config: AlertingConfig) -> list[InhibitRule]:
        return [InhibitRule(r.source_matchers, r.target_matchers, tuple(r.equal)) for r in config.inhibit_rules]

    def _stamp(self) -> tuple[float, int] | None:
        try:
            st = self.settings.rules_path.stat()
            return (st.st_mtime, st.st_size)
        except OSError:
            return None

    def reload_rules(self) -> list[str]:
        """Re-read the rules file; on error keep the rules in force and return the problems."""
        try:
            config = load_config(self.settings.rules_path)
        except ConfigError as exc:
            self.rules_error = exc.errors
            self.log.error("rules.reload_failed", errors=exc.errors)
            return exc.errors
        self.config = config
        self.engine.set_config(config)
        self.correlator.config = config.incidents
        self.dispatcher.route = build_route(config.route)
        self.dispatcher.inhibit_rules = self._inhibit_rules(config)
        self.buckets.clear()
        self.rules_error, self.rules_loaded_at = [], time.time()
        self.log.info("rules.reloaded", rules=len(config.rules), file=str(self.settings.rules_path))
        return []

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            stamp = self._stamp()
            if stamp != self._rules_stamp:
                self._rules_stamp = stamp
                self.reload_rules()

    # ---------------------------------------------------------------- inputs -> transitions

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        await self._apply(self.engine.observe_telemetry(data, self.clock()))

    async def on_node(self, env: Envelope, data: NodeRegistered | NodeHeartbeat) -> None:
        now = self.clock()
        seen = min(env.time, now)
        info = None
        if isinstance(data, NodeRegistered):
            info = NodeInfo(rack=data.rack, pool=data.pool)
            await self.redis.hset(self.k["topology"], f"{data.cluster}/{data.node}", json.dumps(info.__dict__))
        if (now - seen).total_seconds() > LIVENESS_HORIZON_S:
            if info is not None:
                self.engine.nodes[(data.cluster, data.node)] = info
            return
        self.engine.observe_node(data.cluster, data.node, info, seen)

    async def on_event(self, env: Envelope, data) -> None:
        if isinstance(data, JobSubmitted):
            # The workload class of the job's GPUs while it runs (baselines per model and class).
            self.engine.observe_job(data.job_id, data.workload_class)
            await self.redis.hset(self.k["job_classes"], data.job_id, data.workload_class)
            return
        if isinstance(data, (JobFinished, JobFailed, JobRejected)):
            self.engine.forget_job(data.job_id)
            await self.redis.hdel(self.k["job_classes"], data.job_id)
        await self._apply(self.engine.observe_event(data.event_name, data, self.clock()))

    async def _apply(self, transitions: list[Transition]) -> None:
        changed = False
        for tr in transitions:
            if tr.firing and tr.fingerprint not in self._firing:
                alert = AlertRaised(
                    fingerprint=tr.fingerprint, rule=tr.rule.name, severity=tr.rule.severity,
                    category=tr.rule.category, summary=tr.summary, labels=tr.labels,
                    value=tr.value, starts_at=tr.at,
                )
                await self._transition(tr.fingerprint, alert, raised=True)
                changed = True
            elif not tr.firing and tr.fingerprint in self._firing:
                was = self._firing[tr.fingerprint]
                resolved = AlertResolved(fingerprint=tr.fingerprint, rule=was.rule, labels=was.labels,
                                         summary=tr.summary, starts_at=was.starts_at, ends_at=max(tr.at, was.starts_at))
                await self._transition(tr.fingerprint, resolved, raised=False)
                changed = True
        if changed:
            await self.publish_staged()

    async def _transition(self, fp: str, alert: AlertRaised | AlertResolved, raised: bool) -> None:
        kind = "raised" if raised else "resolved"
        env = make_envelope(
            alert,
            source=f"whaleflux/alerting/{self.settings.instance}",
            subject=fp,
            event_id=f"{kind}-{fp}-{int(alert.starts_at.timestamp() * 1000)}",
            correlation_id=fp,
        )
        async with self.redis.pipeline(transaction=True) as pipe:
            if raised:
                pipe.hset(self.k["firing"], fp, alert.model_dump_json())
            else:
                pipe.hdel(self.k["firing"], fp)
            self.outbox.stage(pipe, subjects.ALERT_RAISED if raised else subjects.ALERT_RESOLVED, env)
            await pipe.execute()
        if raised:
            self._firing[fp] = alert
        else:
            self._firing.pop(fp, None)
        self.log.info(f"alert.{kind}", fingerprint=fp, rule=alert.rule, summary=alert.summary)

    # ---------------------------------------------------------------- alerts -> groups -> deliveries

    async def on_alert(self, env: Envelope, data: AlertRaised | AlertResolved) -> None:
        """Group an alert event (ours or another service's) and queue what is due."""
        async with self._lock:
            now = self.clock()
            drains: list[tuple[Envelope, str]] = []  # (event, subject node.drain_requested.<cluster>.<node>)
            incident = None
            if isinstance(data, AlertRaised):
                labels = {"alertname": data.rule, "severity": data.severity, "category": data.category, **data.labels}
                incident = self.correlator.assign(data.fingerprint, labels, now)
                labels["incident"] = incident.id
                annotations = {"summary": data.summary, **data.annotations}
                if data.value is not None:
                    annotations.setdefault("value", f"{data.value:g}")
                ack = self.acks.get(data.fingerprint)
                alert = GroupedAlert(fingerprint=data.fingerprint, labels=labels, annotations=annotations,
                                     starts_at=data.starts_at,
                                     acknowledged=bool(ack and ack.get("starts_at") == data.starts_at.isoformat()))
                changed = self.dispatcher.add(alert, now)
                rule = self.config.rule(data.rule)
                node, cluster = data.labels.get("Hostname"), data.labels.get("cluster")
                if (rule is not None and "drain" in rule.actions and data.severity == "critical" and node and cluster
                        and self.correlator.needs_drain(incident, f"{cluster}/{node}")):
                    drain = NodeDrainRequested(cluster=cluster, node=node, reason=f"{data.rule}: {data.summary}"[:500],
                                               fingerprint=data.fingerprint)
                    drains.append((make_envelope(drain, source=f"whaleflux/alerting/{self.settings.instance}",
                                                 subject=node, event_id=f"drain-{incident.id}-{cluster}-{node}",
                                                 correlation_id=data.fingerprint),
                                   subjects.node_drain_requested(cluster, node)))
            else:
                old = self._grouped(data.fingerprint)
                incident = self.correlator.resolve(data.fingerprint, now)
                if old is None:
                    changed = []
                else:
                    changed = self.dispatcher.add(old.model_copy(update={"ends_at": data.ends_at}), now)
            notifications, flushed, removed = self.dispatcher.flush(now, list(self.silences.values()))
            await self._persist(set(changed) | set(flushed), removed, [incident] if incident else [], notifications,
                                drains)
        if drains:
            for env, subject in drains:
                self.log.warning("node.drain_requested", node=env.subject, subject=subject, rule=data.rule)
            await self.publish_staged()

    def _grouped(self, fingerprint: str) -> GroupedAlert | None:
        for g in self.dispatcher.groups.values():
            a = g.alerts.get(fingerprint)
            if a is not None:
                return a
        return None

    async def _persist(self, changed, removed, incidents: list[Incident], notifications: list[Notification],
                       drains=()) -> None:
        """Groups, incidents, queued deliveries and drain events: one MULTI, so a crash loses or doubles nothing."""
        k = self.k
        deliveries = [d for n in notifications for d in self._deliveries(n)]
        async with self.redis.pipeline(transaction=True) as pipe:
            for key in changed:
                g = self.dispatcher.groups.get(key)
                if g is not None:
                    pipe.hset(k["groups"], key, g.model_dump_json())
            for key in removed:
                pipe.hdel(k["groups"], key)
            for inc in incidents:
                if inc.id in self.correlator.incidents:
                    pipe.hset(k["incidents"], inc.id, inc.model_dump_json())
            for d in deliveries:
                pipe.hset(k["delivery"], d.id, d.model_dump_json())
                pipe.zadd(k["queue"], {d.id: d.created_at.timestamp()})
            for env, subject in drains:
                self.outbox.stage(pipe, subject, env)
            await pipe.execute()
        if deliveries:
            self._wake.set()

    def _deliveries(self, n: Notification) -> list[Delivery]:
        """One delivery per URL of the notification's receiver."""
        inc_id = n.group_labels.get("incident") or next((a.labels.get("incident") for a in n.alerts), None)
        inc = self.correlator.incidents.get(inc_id) if inc_id else None
        n = n.model_copy(update={"title": inc.title() if inc else ""})
        recv = self._receiver(n.receiver)
        rtype = recv.type if recv else "webhook"
        if n.status == "acknowledged" and rtype not in WANTS_ACK:
            return []
        if n.status == "resolved" and recv is not None and not recv.send_resolved:
            return []
        count = max(len(self._urls(recv)) if recv else 1, 1)
        return [Delivery(id=f"{n.id}@{n.receiver}#{i}", receiver=n.receiver, receiver_type=rtype, url_index=i,
                         notification=n, created_at=n.created_at) for i in range(count)]

    def _receiver(self, name: str) -> ReceiverConfig | None:
        return next((r for r in self.config.receivers if r.name == name), None)

    def _urls(self, recv: ReceiverConfig) -> list[str]:
        if recv.url:
            return [recv.url]
        if recv.url_env:
            if recv.url_env == "WHALEFLUX_ALERTING_WEBHOOK_URLS":
                return self.settings.webhook_urls
            return [u.strip() for u in os.environ.get(recv.url_env, "").split(",") if u.strip()]
        if recv.type == "pagerduty":
            from .receivers.pagerduty import DEFAULT_URL

            return [DEFAULT_URL]
        return []

    # ---------------------------------------------------------------- time-driven work

    async def _tick_loop(self) -> None:
        last_expire = 0.0
        while True:
            await asyncio.sleep(self.settings.alerting_tick_s)
            now = self.clock()
            await self._apply(self.engine.tick(now))
            due = self.dispatcher.next_due()
            if due is not None and due <= now:
                async with self._lock:
                    notifications, flushed, removed = self.dispatcher.flush(now, list(self.silences.values()))
                    await self._persist(flushed, removed, [], notifications)
            if time.monotonic() - last_expire > 10:
                last_expire = time.monotonic()
                closed = self.correlator.expire(now)
                if closed:
                    await self.redis.hdel(self.k["incidents"], *closed)

    async def poll_findings(self) -> bool:
        """Fetch inventory's findings once and feed them to the cost guardians; False when inventory did not answer."""
        url = self.settings.inventory_url.rstrip("/") + "/v1/findings"
        now = self.clock()
        try:
            resp = await self.http.get(url, timeout=10.0)
            resp.raise_for_status()
            findings = resp.json()
            if not isinstance(findings, list) or not all(isinstance(f, dict) and "kind" in f for f in findings):
                raise ValueError("unexpected response shape (want a list of {kind, summary, detail, ...})")
        except (httpx.HTTPError, ValueError) as exc:
            # Keep what fires: an unreachable inventory is no reason to resolve (or raise) anything.
            if isinstance(exc, httpx.HTTPStatusError):
                error = f"inventory answered {exc.response.status_code}"
            elif isinstance(exc, httpx.HTTPError):
                error = type(exc).__name__  # not str(exc): it may carry the URL
            else:
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
            if error != self.findings_status["error"]:
                self.log.warning("findings.poll_failed", error=error)
            self.findings_status.update(error=error, error_at=now.isoformat())
            return False
        self.findings_status.update(ok_at=now.isoformat(), error=None, error_at=None, findings=len(findings))
        await self._apply(self.engine.observe_findings(findings, now))
        return True

    async def _findings_loop(self) -> None:
        await asyncio.sleep(min(2.0, self.settings.alerting_findings_poll_s))
        while True:
            if self.engine.finding_rules:
                try:
                    await self.poll_findings()
                except Exception as exc:  # never let the guardian loop die
                    self.log.error("findings.poll_crashed", error=repr(exc))
            await asyncio.sleep(self.settings.alerting_findings_poll_s)

    async def _delivery_loop(self) -> None:
        while True:
            now = self.clock().timestamp()
            ids = await self.redis.zrangebyscore(self.k["queue"], 0, now, start=0, num=200)
            if ids:
                by_receiver: dict[str, list[Delivery]] = {}
                raws = await self.redis.hmget(self.k["delivery"], ids)
                for did, raw in zip(ids, raws):
                    if raw is None:
                        await self.redis.zrem(self.k["queue"], did)
                        continue
                    d = Delivery.model_validate_json(raw)
                    by_receiver.setdefault(d.receiver, []).append(d)
                # Receivers in parallel, so one slow endpoint does not hold up the others; in order within one.
                await asyncio.gather(*(self._deliver_all(ds) for ds in by_receiver.values()))
                continue
            nxt = await self.redis.zrange(self.k["queue"], 0, 0, withscores=True)
            wait = min(max(nxt[0][1] - now, 0.01), 1.0) if nxt else 1.0
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass

    async def _deliver_all(self, deliveries: list[Delivery]) -> None:
        for d in sorted(deliveries, key=lambda d: (d.created_at, d.id)):
            await self._deliver(d)

    async def _deliver(self, d: Delivery) -> None:
        k = self.k
        now = self.clock()
        recv = self._receiver(d.receiver)
        if recv is None:
            return await self._finish(d, "skipped", None, f"no receiver named {d.receiver!r} in the rules file")
        urls = self._urls(recv)
        if d.url_index >= len(urls):
            return await self._finish(d, "skipped", None, "no URL configured for this receiver")
        if recv.rate_limit is not None:
            bucket = self.buckets.setdefault(recv.name, TokenBucket(recv.rate_limit.per_second, recv.rate_limit.burst))
            wait = bucket.take(now.timestamp())
            if wait > 0:
                await self.redis.zadd(k["queue"], {d.id: now.timestamp() + wait})
                return
        extra = {}
        if recv.type == "pagerduty":
            key = recv.routing_key or os.environ.get(recv.routing_key_env or "", "")
            if not key:
                return await self._finish(d, "skipped", None, f"routing key not set ({recv.routing_key_env})")
            extra["routing_key"] = key
        body = BUILDERS[recv.type](d.notification, receiver=recv.name, external_url=self.settings.external_url, **extra)
        d.attempts += 1
        try:
            status = await self._post(urls[d.url_index], body)
        except DeliveryError as exc:
            if not exc.retryable:
                return await self._finish(d, "rejected", exc.status, exc.reason)
            age = (now - d.created_at).total_seconds()
            if age > self.settings.alerting_delivery_max_age_s:
                return await self._finish(d, "failed", exc.status, f"gave up after {d.attempts} tries: {exc.reason}")
            d.last_error = exc.reason
            due = now.timestamp() + backoff_s(d.attempts, exc.retry_after_s)
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(k["delivery"], d.id, d.model_dump_json())
                pipe.zadd(k["queue"], {d.id: due})
                await pipe.execute()
            self.log.warning("delivery.retry", receiver=d.receiver, delivery=d.id, attempt=d.attempts, reason=exc.reason)
            return
        await self._finish(d, "delivered", status, None)

    async def _post(self, url: str, body: dict) -> int:
        try:
            resp = await self.http.post(url, json=body, timeout=5.0)
        except httpx.HTTPError as exc:
            # The URL may hold a token: name the error type only.
            raise DeliveryError(f"{type(exc).__name__} posting", retryable=True) from None
        if resp.status_code >= 500 or resp.status_code == 429:
            retry_after = resp.headers.get("Retry-After")
            err = DeliveryError(f"receiver answered {resp.status_code}", retryable=True, status=resp.status_code)
            if retry_after and retry_after.isdigit():
                err.retry_after_s = float(retry_after)
            raise err
        if resp.status_code >= 400:
            raise DeliveryError(f"receiver answered {resp.status_code}", retryable=False, status=resp.status_code)
        return resp.status_code

    async def _finish(self, d: Delivery, status: str, http_status: int | None, reason: str | None) -> None:
        now = self.clock()
        n = d.notification
        entry = LogEntry(
            delivery_id=d.id, notification_id=n.id, receiver=d.receiver, receiver_type=d.receiver_type,
            url_index=d.url_index, status=status, notification_status=n.status, group_key=n.group_key,
            title=n.title or (n.alerts[0].annotations.get("summary", "") if n.alerts else ""), alerts=len(n.alerts),
            attempts=d.attempts, http_status=http_status, reason=reason, created_at=d.created_at, finished_at=now,
            latency_ms=round((now - d.created_at).total_seconds() * 1000, 2),
        )
        k = self.k
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(k["queue"], d.id)
            pipe.hdel(k["delivery"], d.id)
            pipe.lpush(k["log"], entry.model_dump_json())
            pipe.ltrim(k["log"], 0, LOG_KEEP - 1)
            await pipe.execute()
        self.log.info("delivery." + status, receiver=d.receiver, delivery=d.id, attempts=d.attempts,
                      http_status=http_status, reason=reason)

    # ---------------------------------------------------------------- HTTP

    def _alert_view(self, a: AlertRaised) -> dict:
        now = self.clock()
        g = self._grouped(a.fingerprint)
        labels = g.labels if g else {"alertname": a.rule, "severity": a.severity, **a.labels}
        inc = self.correlator.incident_of(a.fingerprint)
        ack = self.acks.get(a.fingerprint)
        return {
            **a.model_dump(mode="json"),
            "incident": inc.id if inc else None,
            "acknowledged": ack if ack and ack.get("starts_at") == a.starts_at.isoformat() else None,
            "silenced_by": silenced_by(labels, list(self.silences.values()), now),
            "inhibited": inhibited(labels, a.fingerprint, self.dispatcher.firing_labels(), self.dispatcher.inhibit_rules),
        }

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/alerts", tags=["alerts"])
        async def alerts() -> list[dict]:
            """Alerts firing now, oldest first, with incident, acknowledgement, silences and inhibition."""
            return [self._alert_view(a) for a in sorted(self._firing.values(), key=lambda a: a.starts_at)]

        @app.post("/v1/alerts/{fingerprint}/ack", tags=["alerts"], dependencies=[admin])
        async def acknowledge(fingerprint: str, req: AckRequest) -> dict:
            """Acknowledge a firing alert: no more repeats; PagerDuty receivers get `acknowledge`."""
            alert = self._firing.get(fingerprint)
            if alert is None:
                raise HTTPException(404, f"fingerprint: no firing alert {fingerprint!r}")
            ack = {"by": req.by, "comment": req.comment, "at": self.clock().isoformat(),
                   "starts_at": alert.starts_at.isoformat()}
            async with self._lock:
                self.acks[fingerprint] = ack
                changed = self.dispatcher.acknowledge(fingerprint)
                for key in changed:
                    g = self.dispatcher.groups[key]
                    if g.last_notified is not None:
                        g.next_flush = min(g.next_flush, self.clock())
                notifications, flushed, removed = self.dispatcher.flush(self.clock(), list(self.silences.values()))
                await self.redis.hset(self.k["acks"], fingerprint, json.dumps(ack))
                await self._persist(set(changed) | set(flushed), removed, [], notifications)
            return {"fingerprint": fingerprint, **ack}

        @app.get("/v1/silences", tags=["silences"])
        async def list_silences() -> list[dict]:
            now = self.clock()
            return [{**s.model_dump(mode="json"), "state": s.state(now)}
                    for s in sorted(self.silences.values(), key=lambda s: s.starts_at)]

        @app.post("/v1/silences", tags=["silences"], dependencies=[admin], status_code=201)
        async def create_silence(req: SilenceRequest) -> dict:
            """Mute alerts matching every matcher from `starts_at` (default now) to `ends_at` (or for `duration_s`)."""
            now = self.clock()
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
            ends = req.ends_at or starts + timedelta(seconds=seconds)
            try:
                silence = Silence(id=secrets.token_hex(8), matchers=req.matchers, starts_at=starts, ends_at=ends,
                                  created_by=req.created_by, comment=req.comment)
            except ValueError as exc:
                raise HTTPException(422, str(exc).splitlines()[-1] if "\n" in str(exc) else str(exc)) from None
            await self.redis.hset(self.k["silences"], silence.id, silence.model_dump_json())
            self.silences[silence.id] = silence
            self.log.info("silence.created", silence=silence.id, by=req.created_by)
            return {**silence.model_dump(mode="json"), "state": silence.state(now)}

        @app.post("/v1/silences/{silence_id}/expire", tags=["silences"], dependencies=[admin])
        async def expire_silence(silence_id: str) -> dict:
            s = self.silences.get(silence_id)
            if s is None:
                raise HTTPException(404, f"silence_id: no silence {silence_id!r}")
            s = s.model_copy(update={"expired_at": self.clock()})
            await self.redis.hset(self.k["silences"], s.id, s.model_dump_json())
            self.silences[s.id] = s
            return {**s.model_dump(mode="json"), "state": s.state(self.clock())}

        @app.get("/v1/incidents", tags=["alerts"])
        async def incidents() -> list[dict]:
            now = self.clock()
            return [{"id": i.id, "title": i.title(), "correlation": i.correlation, "by": i.by,
                     "opened_at": i.opened_at, "last_at": i.last_at, "firing": i.firing_count(),
                     "members": len(i.members), "open": i.is_open(now, self.config.incidents.window),
                     "drained_nodes": i.drained_nodes}
                    for i in sorted(self.correlator.incidents.values(), key=lambda i: i.opened_at)]

        @app.get("/v1/notifications", tags=["alerts"])
        async def notifications(
            receiver: str | None = None,
            status: str | None = Query(None, description="delivered, rejected, failed, skipped, pending"),
            limit: Annotated[int, Query(ge=1, le=LOG_KEEP)] = 100,
        ) -> list[dict]:
            """The notification log, newest first; `pending` lists what is queued or being retried."""
            if status == "pending":
                raws = await self.redis.hvals(self.k["delivery"])
                rows = [Delivery.model_validate_json(r) for r in raws]
                rows = [d for d in rows if receiver is None or d.receiver == receiver]
                return [{"delivery_id": d.id, "receiver": d.receiver, "status": "pending", "attempts": d.attempts,
                         "last_error": d.last_error, "created_at": d.created_at,
                         "notification_status": d.notification.status} for d in rows][:limit]
            out = []
            for raw in await self.redis.lrange(self.k["log"], 0, LOG_KEEP - 1):
                e = LogEntry.model_validate_json(raw)
                if (receiver is None or e.receiver == receiver) and (status is None or e.status == status):
                    out.append(e.model_dump(mode="json"))
                    if len(out) >= limit:
                        break
            return out

        @app.get("/v1/rules", tags=["rules"])
        async def rules() -> dict:
            return {"file": str(self.settings.rules_path), "loaded_at": self.rules_loaded_at,
                    "errors": self.rules_error,
                    "rules": [{"name": r.name, "kind": r.kind, "severity": r.severity, "for_s": r.for_s}
                              for r in self.config.rules],
                    "receivers": [{"name": r.name, "type": r.type, "urls": len(self._urls(r))}
                                  for r in self.config.receivers],
                    "guardians": {"rules": [r.name for r in self.engine.finding_rules],
                                  "inventory": {"poll_s": self.settings.alerting_findings_poll_s,
                                                **self.findings_status}}}

        @app.post("/admin/rules/reload", tags=["rules"], dependencies=[admin])
        async def reload() -> dict:
            """Re-read the rules file now; 422 with `FILE:LINE: key: problem` lines when it is bad."""
            errors = self.reload_rules()
            if errors:
                raise HTTPException(422, errors)
            return {"rules": len(self.config.rules)}


def main() -> None:
    run_service(AlertingService(AlertingSettings()))
