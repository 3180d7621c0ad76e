"""Settings: no default secrets outside development, secrets never shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from whaleflux.shared.settings import CommonSettings


def test_production_refuses_to_start_without_strong_secrets(monkeypatch):
    monkeypatch.setenv("WHALEFLUX_ENVIRONMENT", "production")
    with pytest.raises(ValidationError, match="WHALEFLUX_ADMIN_TOKEN"):
        CommonSettings()
    monkeypatch.setenv("WHALEFLUX_ADMIN_TOKEN", "short")
    with pytest.raises(ValidationError, match="at least 16"):
        CommonSettings()
    for name in ("ADMIN_TOKEN", "NATS_PASSWORD", "REDIS_PASSWORD"):
        monkeypatch.setenv(f"WHALEFLUX_{name}", "x" * 32)
    assert CommonSettings().environment == "production"


def test_development_without_a_token_locks_admin_behind_a_random_one(monkeypatch):
    monkeypatch.delenv("WHALEFLUX_ADMIN_TOKEN", raising=False)
    a, b = CommonSettings(), CommonSettings()
    token = a.secret("admin_token")
    assert token is not None and len(token) >= 32 and token != b.secret("admin_token")


def test_conventional_urls_and_redaction(monkeypatch):
    monkeypatch.setenv("NATS_URL", "nats://example:4222")
    monkeypatch.setenv("WHALEFLUX_REDIS_PASSWORD", "hunter2hunter2hunter2")
    s = CommonSettings()
    assert s.nats_url == "nats://example:4222"
    shown = s.redacted()
    assert shown["redis_password"] == "********" and "hunter2" not in str(shown)


def test_credentials_inside_urls_are_masked(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://:topsecretpw@db:6379/0")
    shown = CommonSettings().redacted()
    assert shown["redis_url"] == "redis://********@db:6379/0"


def test_a_service_port_outside_the_range_is_refused(monkeypatch):
    monkeypatch.setenv("WHALEFLUX_HTTP_PORT", "70000")
    from whaleflux.billing.app import BillingSettings

    with pytest.raises(ValidationError, match="between 0 and 65535"):
        BillingSettings()


def test_the_agent_needs_no_redis_password_in_production(monkeypatch):
    from whaleflux.agent.app import AgentSettings

    monkeypatch.setenv("WHALEFLUX_ENVIRONMENT", "production")
    monkeypatch.setenv("WHALEFLUX_ADMIN_TOKEN", "a" * 32)
    monkeypatch.setenv("WHALEFLUX_NATS_PASSWORD", "n" * 32)
    assert AgentSettings().environment == "production"


def test_sentinels_are_host_port_pairs_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv("WHALEFLUX_REDIS_SENTINELS", "redis-sentinel-0.redis:26379, 10.0.0.7:26380,")
    monkeypatch.setenv("WHALEFLUX_REDIS_MASTER", "wf")
    s = CommonSettings()
    assert s.sentinel_addresses() == [("redis-sentinel-0.redis", 26379), ("10.0.0.7", 26380)]
    assert (s.redis_master, s.redis_min_replicas) == ("wf", 1)
    for bad in ("sentinel", "sentinel:port", ":26379", "host:70000"):
        monkeypatch.setenv("WHALEFLUX_REDIS_SENTINELS", bad)
        with pytest.raises(ValidationError, match="WHALEFLUX_REDIS_SENTINELS"):
            CommonSettings()


def test_without_sentinels_there_are_none():
    assert CommonSettings(redis_sentinels="").sentinel_addresses() == []
