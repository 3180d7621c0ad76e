"""Inventory's settings (WHALEFLUX_* environment variables, docs/services/inventory.md)."""

from __future__ import annotations

from pydantic import Field

from whaleflux.shared.settings import CommonSettings


class InventorySettings(CommonSettings):
    http_port: int = 8705
    missing_after_s: float = Field(30.0, gt=0)
    assets_file: str | None = Field(None, description="YAML declarations; re-read when its content changes")
    lease_horizons_days: list[int] = Field(default_factory=lambda: [30, 7, 1])
    check_interval_s: float = Field(60.0, gt=0, description="how often leases and the assets file are checked")
    idle_threshold_pct: float = Field(5.0, ge=0, le=100)
    reserved_idle_hours: float = Field(72.0, gt=0)
    consolidation_threshold: float = Field(0.3, ge=0, le=1)
    consolidation_days: float = Field(3.0, gt=0)
    retention_days: float = Field(40.0, gt=0)
    billing_url: str | None = Field(None, description="billing's base URL: owned GPUs valued with its price book")
