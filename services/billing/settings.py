"""Billing's settings (environment `WHALEFLUX_*`, see docs/services/billing.md)."""

from __future__ import annotations

from pydantic import Field

from whaleflux.shared.settings import CommonSettings


class BillingSettings(CommonSettings):
    http_port: int = 8704
    inventory_url: str = Field("http://127.0.0.1:8705", description="inventory service, for GET /v1/assets")
    inventory_refresh_s: float = Field(60.0, gt=0, description="how often ownership terms are fetched")
    pricebook_file: str | None = Field(None, description="price book YAML; re-read when its content changes")
    budget_check_interval_s: float = Field(300.0, gt=0)
    energy_retention_days: float = Field(400.0, gt=0)
    billing_account_id: str = "whaleflux"
    billing_account_name: str = "WhaleFlux GPU fleet"
