"""Alerting service: evaluates rules on the live telemetry stream and notifies receivers.

Raising and notifying are separate steps joined by the ALERTS stream: a rule
that fires stages `alert.raised` in the outbox with the alert state (one Redis
transaction); the `alerting-notify` consumer posts each alert event to every
configured webhook, retrying with back-off, and remembers which receivers
already have it.
"""

from __future__ import annotations

import hashlib

import httpx
from fastapi import FastAPI
from pydantic import Field, field_validator

from whaleflux.shared import subjects
from whaleflux.shared.bus import Reject, Retry
from whaleflux.shared.catalog import gpu_models, model_key
from whaleflux.shared.events import AlertRaised, AlertResolved, Envelope, GpuTelemetry, make_envelope
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from .notify import DeliveryError, alertmanager_payload, post_webhook
from .rules import thermal

NOTIFIED_TTL_S = 7 * 86400


class AlertingSettings(CommonSettings):
    http_port: int = 8703
    # Comma-separated webhook URLs; they may embed tokens, so they are never logged.
    alerting_webhook_urls: str = ""
    external_url: str = Field("http://127.0.0.1:8703", description="this service's URL, put in payloads")

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


class AlertingService(ServiceBase):
    name = "alerting"

    def __init__(self, settings: AlertingSettings, **kw):
        super().__init__(settings, **kw)
        self.settings: AlertingSettings = settings
        self.models = gpu_models()
        self._firing: dict[str, AlertRaised] = {}
        self.http: httpx.AsyncClient | None = None

    def consumers(self):
        return {"alerting-telemetry": self.on_telemetry, "alerting-notify": self.on_alert}

    async def on_ready(self) -> None:
        self.http = httpx.AsyncClient()
        raw = await self.redis.hgetall(f"{self.prefix}:firing")
        self._firing = {fp: AlertRaised.model_validate_json(v) for fp, v in raw.items()}
        await self.publish_staged()

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        await super().stop()

    # ---------------------------------------------------------------- rules

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        changed = False
        for gpu in data.gpus:
            key = model_key(gpu.model)
            verdict = thermal.evaluate(gpu, self.models.get(key) if key else None)
            if verdict is None:
                continue
            labels = {
                "alertname": thermal.RULE,
                "UUID": gpu.uuid,
                "gpu": str(gpu.index),
                "Hostname": data.node,
                "cluster": data.cluster,
                "modelName": gpu.model,
            }
            fp = thermal.fingerprint(labels)
            if verdict.firing and fp not in self._firing:
                alert = AlertRaised(
                    fingerprint=fp,
                    rule=thermal.RULE,
                    severity="critical",
                    category="thermal",
                    summary=f"GPU {gpu.index} ({gpu.uuid}) on {data.node} at {gpu.temperature_c:.0f} C "
                    f"(slowdown {verdict.threshold_c:.0f} C)",
                    labels={k: v for k, v in labels.items() if k != "alertname"},
                    value=gpu.temperature_c,
                    starts_at=data.sample_time,
                )
                await self._transition(fp, alert, raised=True)
                changed = True
            elif verdict.resolved and fp in self._firing:
                was = self._firing[fp]
                resolved = AlertResolved(
                    fingerprint=fp,
                    rule=was.rule,
                    labels=was.labels,
                    summary=f"GPU {gpu.index} on {data.node} back to {gpu.temperature_c:.0f} C",
                    starts_at=was.starts_at,
                    ends_at=data.sample_time,
                )
                await self._transition(fp, resolved, raised=False)
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
                pipe.hset(f"{self.prefix}:firing", fp, alert.model_dump_json())
            else:
                pipe.hdel(f"{self.prefix}:firing", fp)
            self.outbox.stage(pipe, subjects.ALERT_RAISED if raised else subjects.ALERT_RESOLVED, env)
            await pipe.execute()
        if raised:
            self._firing[fp] = alert
        else:
            self._firing.pop(fp, None)
        self.log.info(f"alert.{kind}", fingerprint=fp, rule=alert.rule, summary=alert.summary)

    # ---------------------------------------------------------------- notification

    async def on_alert(self, env: Envelope, data: AlertRaised | AlertResolved) -> None:
        payload = alertmanager_payload(data, self.settings.external_url)
        retry, permanent = [], []
        for url in self.settings.webhook_urls:
            done_key = f"{self.prefix}:notified:{env.id}:{hashlib.sha256(url.encode()).hexdigest()[:12]}"
            if await self.redis.exists(done_key):
                continue
            try:
                await post_webhook(self.http, url, payload)
            except DeliveryError as exc:
                if exc.retryable:
                    retry.append(exc.reason)
                    continue
                permanent.append(exc.reason)  # recorded as done: retrying cannot help
            await self.redis.set(done_key, 1, ex=NOTIFIED_TTL_S)
        if retry:
            raise Retry("webhook delivery failed: " + "; ".join(retry))
        if permanent:
            raise Reject("webhook refused the alert: " + "; ".join(permanent))

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/alerts", tags=["alerts"])
        async def alerts() -> list[AlertRaised]:
            """Alerts firing now."""
            return sorted(self._firing.values(), key=lambda a: a.starts_at)


def main() -> None:
    run_service(AlertingService(AlertingSettings()))
