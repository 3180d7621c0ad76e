"""Cost guardians' input: inventory's findings, fetched over HTTP (GET /v1/findings) and parsed with the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import structlog
from pydantic import ValidationError

from whaleflux.shared.contracts import FINDINGS, Finding

FINDINGS_TIMEOUT_S = 10.0


class FindingsSource:
    """Fetches inventory's findings and keeps the status of the last poll (shown by GET /v1/rules)."""

    def __init__(self, inventory_url: str, http: httpx.AsyncClient, log: structlog.typing.FilteringBoundLogger,
                 headers: dict[str, str] | None = None) -> None:
        self.url = inventory_url.rstrip("/") + "/v1/findings"
        self.http = http
        self.headers = headers or {}  # alerting's token for inventory; the shared client also calls receivers
        self.log = log
        self.status: dict[str, Any] = {"ok_at": None, "error": None, "error_at": None, "findings": 0}

    async def fetch(self, now: datetime) -> list[Finding] | None:
        """The findings; None when inventory did not answer with them (what fires stays as it is)."""
        try:
            resp = await self.http.get(self.url, timeout=FINDINGS_TIMEOUT_S, headers=self.headers)
            resp.raise_for_status()
            findings = FINDINGS.validate_json(resp.content)
        except (httpx.HTTPError, ValidationError) as exc:
            self._failed(_describe(exc), now)
            return None
        self.status.update(ok_at=now.isoformat(), error=None, error_at=None, findings=len(findings))
        return findings

    def _failed(self, error: str, now: datetime) -> None:
        if error != self.status["error"]:
            self.log.warning("findings.poll_failed", error=error)
        self.status.update(error=error, error_at=now.isoformat())


def _describe(exc: httpx.HTTPError | ValidationError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"inventory answered {exc.response.status_code}"
    if isinstance(exc, httpx.HTTPError):
        return type(exc).__name__  # not str(exc): it may carry the URL
    # Where and what, never the values (a response is no place to copy into logs).
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "(body)"
    return f"unexpected findings from inventory: {exc.error_count()} problem(s), first at {where}: {first['msg']}"
