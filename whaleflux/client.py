"""How the CLI finds a running WhaleFlux: environment first, then the local config of `whaleflux up`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from whaleflux.shared.bus import Bus

# httpx is imported where a request is made, the config file's model (pydantic) where it is read, and the
# bus (nats-py, event models) only by `bus()`: `whaleflux --help` starts without any of them.

DEFAULT_PORTS = {
    "telemetry": 8701, "scheduler": 8702, "alerting": 8703, "billing": 8704, "inventory": 8705, "agent": 8710,
}


class ClientError(Exception):
    """Something the user must fix; the message says what."""


class NotFound(ClientError):
    """The service answered 404: no such job, node, alert..."""


class Unreachable(ClientError):
    """The service did not answer (not running, wrong address, timed out), or said it cannot now (503)."""


@dataclass
class Connection:
    nats_url: str
    nats_user: str | None
    nats_password: str | None
    admin_token: str | None
    services: dict[str, str]

    @classmethod
    def discover(cls) -> Connection:
        from whaleflux.shared import localconfig

        cfg = localconfig.load()
        env = os.environ
        services = {
            name: env.get(f"WHALEFLUX_{name.upper()}_URL")
            or (cfg.services.get(name) if cfg else None)
            or f"http://127.0.0.1:{port}"
            for name, port in DEFAULT_PORTS.items()
        }
        return cls(
            nats_url=env.get("NATS_URL") or (cfg.nats_url if cfg else None) or "nats://127.0.0.1:4222",
            nats_user=env.get("WHALEFLUX_NATS_USER") or (cfg.nats_user if cfg else None),
            nats_password=env.get("WHALEFLUX_NATS_PASSWORD") or (cfg.nats_password if cfg else None),
            # A person's own token (`whaleflux tokens issue`), else the admin token of `whaleflux up`.
            admin_token=env.get("WHALEFLUX_TOKEN") or env.get("WHALEFLUX_ADMIN_TOKEN")
            or (cfg.admin_token if cfg else None),
            services=services,
        )

    async def bus(self) -> Bus:
        import asyncio

        from whaleflux.shared.bus import Bus

        try:
            # A deadline of our own: nats-py retries a refused first connection without end when it is told
            # "no reconnects" (max_reconnect_attempts=0 means unlimited there).
            return await asyncio.wait_for(Bus.connect(
                self.nats_url, source="whaleflux/cli", user=self.nats_user, password=self.nats_password,
                connect_timeout=3, reconnect=False,
            ), timeout=4)
        except Exception as exc:  # noqa: BLE001 - whatever stops the connection, the user gets one line about it
            raise Unreachable(
                f"cannot reach NATS at {self.nats_url} ({type(exc).__name__}); is `whaleflux up` running?"
            ) from None

    def auth(self) -> dict[str, str]:
        """The token on every request: reads need a viewer in production, writes their role (docs/security.md)."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def get(self, service: str, path: str, **params: Any) -> Any:
        """GET a service's JSON (parameters that are None are left out); 404 is NotFound, other errors ClientError."""
        import httpx

        url = self.services[service] + path
        try:
            resp = httpx.get(url, params={k: v for k, v in params.items() if v is not None}, headers=self.auth(),
                             timeout=10)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"cannot reach the {service} service at {self.services[service]} ({type(exc).__name__})") from None
        if resp.status_code == 404:
            try:
                detail = resp.json().get("detail", f"not found: {path}")
            except ValueError:
                detail = f"not found: {path}"
            raise NotFound(detail)
        if resp.status_code >= 400:
            raise ClientError(f"{service} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def post_admin(self, service: str, path: str, body: dict[str, Any]) -> Any:
        """POST to an admin endpoint with the admin token; the service's `detail` becomes the error."""
        return self.post(service, path, body)

    def post(self, service: str, path: str, body: dict[str, Any]) -> Any:
        """POST JSON with the token (reads need a viewer in production); no answer or a 503 is `Unreachable`,
        the service's `detail` of another error answer a ClientError."""
        import httpx

        url = self.services[service] + path
        try:
            resp = httpx.post(url, json=body, headers=self.auth(), timeout=10)
        except httpx.HTTPError as exc:
            raise Unreachable(
                f"cannot reach the {service} at {self.services[service]} ({type(exc).__name__})") from None
        if resp.status_code == 503:
            raise Unreachable(f"{service} cannot answer now (503): {resp.text[:300]}")
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise ClientError(f"{service} answered {resp.status_code}: {str(detail)[:500]}")
        return resp.json()
