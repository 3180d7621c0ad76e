"""Telemetry's settings (WHALEFLUX_* environment variables, docs/services/telemetry.md)."""

from __future__ import annotations

from pydantic import Field

from whaleflux.shared.settings import CommonSettings


class TelemetrySettings(CommonSettings):
    http_port: int = 8701
    max_clock_skew_s: float = Field(300.0, gt=0)
    raw_retention_s: float = Field(7200.0, ge=3600, description="raw history kept per GPU (at least 1 h)")
    rollup_retention_s: float = Field(7 * 86400.0, gt=0, description="minute rollups kept per GPU")
    stale_after_s: float = Field(15.0, gt=0, description="a GPU with no newer sample is stale (left out of /metrics)")
    maintenance_interval_s: float = Field(20.0, gt=0)
    rollup_grace_s: float = Field(5.0, ge=0, description="wait this long after a minute ends before rolling it up")
