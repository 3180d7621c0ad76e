"""Alerting's settings (environment `WHALEFLUX_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from whaleflux.shared.settings import CommonSettings

from .config import DEFAULT_RULES_FILE

WEBHOOK_URLS_ENV = "WHALEFLUX_ALERTING_WEBHOOK_URLS"


class AlertingSettings(CommonSettings):
    http_port: int = 8703
    # Comma-separated webhook URLs for the `default` receiver; they may embed tokens, so they are never logged.
    alerting_webhook_urls: str = ""
    alerting_rules_file: str | None = Field(None, description="rules, routes, receivers (YAML); re-read on change")
    alerting_delivery_max_age_s: float = Field(86400.0, gt=0, description="keep retrying a delivery this long")
    alerting_tick_s: float = Field(0.25, gt=0, le=5)
    external_url: str = Field("http://127.0.0.1:8703", description="this service's URL, put in payloads")
    # Cost guardians (`kind: finding` rules) poll inventory's findings over HTTP.
    inventory_url: str = Field("http://127.0.0.1:8705", description="inventory service, for GET /v1/findings")
    alerting_findings_poll_s: float = Field(300.0, gt=0, description="how often cost guardians poll inventory")
    alerting_resolve_timeout_s: float = Field(
        300.0, gt=0, le=30 * 86400,
        description="an alert posted to /api/v2/alerts without endsAt resolves this long after it was last posted "
                    "(Alertmanager's resolve_timeout)")

    @field_validator("alerting_webhook_urls")
    @classmethod
    def _urls(cls, value: str) -> str:
        for url in filter(None, (u.strip() for u in value.split(","))):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{WEBHOOK_URLS_ENV}: each URL must start with http:// or https://")
        return value

    @property
    def webhook_urls(self) -> list[str]:
        return [u.strip() for u in self.alerting_webhook_urls.split(",") if u.strip()]

    @property
    def rules_path(self) -> Path:
        return Path(self.alerting_rules_file) if self.alerting_rules_file else DEFAULT_RULES_FILE
