"""The console's settings: where the other services listen, and how its session cookie behaves."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from whaleflux.shared.settings import CommonSettings


class ConsoleSettings(CommonSettings):
    # The console keeps no Redis state, and talks to NATS only to hear that something changed.
    required_secrets: ClassVar[tuple[str, ...]] = ("admin_token", "nats_password")
    # Its login and session cookies are keyed on the admin token: never without one, tokens file or not.
    admin_token_optional_with_tokens: ClassVar[bool] = False

    http_port: int = Field(8706, ge=0, le=65535)
    telemetry_url: str = "http://127.0.0.1:8701"
    scheduler_url: str = "http://127.0.0.1:8702"
    alerting_url: str = "http://127.0.0.1:8703"
    billing_url: str = "http://127.0.0.1:8704"
    inventory_url: str = "http://127.0.0.1:8705"
    # The simulated fleet's agent (`up` sets it): its admin endpoint clears injected faults (the node page's
    # "Clear injected faults" button, shown only when it is set).
    agent_url: str | None = None
    # Cookies are `Secure` whenever the console is reached over HTTPS: its own TLS, or a proxy's
    # X-Forwarded-Proto: https once `trust_forwarded_proto` says the proxy is trusted to set it. `cookie_secure`
    # forces it always (a proxy that sends no such header).
    cookie_secure: bool = False
    trust_forwarded_proto: bool = False
    session_hours: float = Field(12.0, gt=0, le=24 * 30)
    # At most one refresh of a live view per this many seconds, however many events arrive.
    live_interval_s: float = Field(1.0, ge=0.2, le=60)
    # Job logs live under <home>/jobs on the agent's machine: readable here for `whaleflux up` only.
    home: str | None = None
    upstream_timeout_s: float = Field(5.0, gt=0, le=60)
    # A GPU with no newer sample is stale: the same setting (and default) as telemetry's.
    stale_after_s: float = Field(15.0, gt=0)

    def reader_token(self) -> str:
        """What the console's own background reads carry (the live views every browser shares, the fleet's node
        states): its viewer token, `WHALEFLUX_API_TOKEN` (`up` and deploy/issue_secrets.py issue it), so that a
        compromised console hands out no more than a viewer; without one, its admin token (logged at start)."""
        return self.secret("api_token") or self.secret("admin_token") or ""

    def service_urls(self) -> dict[str, str]:
        return {
            "telemetry": self.telemetry_url, "scheduler": self.scheduler_url, "alerting": self.alerting_url,
            "billing": self.billing_url, "inventory": self.inventory_url,
        } | ({"agent": self.agent_url} if self.agent_url else {})
