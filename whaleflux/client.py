"""How the CLI finds a running WhaleFlux: environment first, then the local config of `whaleflux up`."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


# How the CLI writes a date, in every error about one.
DATE_FORMATS = "a date: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS], in UTC unless an offset such as +02:00 follows, " \
    "e.g. 2026-12-01 or 2026-12-01T09:30"


def refusal_in_words(service: str, detail: Any) -> str:
    """A service's refusal of what the CLI sent (FastAPI's 422 `detail`: a list of pydantic errors), in the user's
    words: the option that sets each field (`--state`), the value, and what it takes. Other details as they are."""
    if not isinstance(detail, list) or not all(isinstance(e, dict) and "loc" in e for e in detail):
        return f"{service} refused the request: {str(detail)[:500]}"
    parts = []
    for err in detail:
        names = [str(p) for p in err["loc"] if isinstance(p, str) and p not in ("query", "body", "path")]
        flag = "--" + (names[-1] if names else "value").replace("_", "-")
        value = err.get("input")
        shown = f" {value!r}" if isinstance(value, str | int | float) else ""
        parts.append(f"{flag}{shown}: {expected_words(err)}")
    return f"{service} refused " + "; ".join(parts)


def expected_words(err: Mapping[str, Any]) -> str:
    """What a field takes, from one pydantic error's type and context."""
    kind, ctx = str(err.get("type", "")), err.get("ctx") or {}
    if kind in ("literal_error", "enum"):
        return f"choose one of {str(ctx.get('expected', '')).replace(' or ', ', ')}"
    if kind.startswith(("datetime", "date", "time")):
        return f"expected {DATE_FORMATS}"
    if kind.startswith("int"):
        return "expected a whole number"
    if kind.startswith(("float", "decimal")) or kind == "finite_number":
        return "expected a number"
    if kind.startswith("bool"):
        return "expected true or false"
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("above", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("below", "lt")}
    if kind in bounds:
        words, key = bounds[kind]
        bound = ctx.get(key)
        return f"must be {words} {bound:g}" if isinstance(bound, int | float) else f"must be {words} {bound}"
    if kind == "missing":
        return "is required"
    message = str(err.get("msg", kind)).removeprefix("Value error, ")
    return message.replace("Input should be", "must be").replace("Input", "the value")


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
            raise ClientError(refusal(service, resp))
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
            raise ClientError(refusal(service, resp))
        return resp.json()


def refusal(service: str, resp: Any) -> str:
    """An error answer (an httpx.Response of 400 or more) as one line: a 422 in the user's words (the options, what
    they take), another answer with its status and the service's `detail`."""
    try:
        detail = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):
        detail = resp.text
    if resp.status_code == 422:
        return refusal_in_words(service, detail)
    return f"{service} answered {resp.status_code}: {str(detail)[:500]}"
