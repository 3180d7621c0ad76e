"""Cost guardians' input: inventory's findings, fetched over HTTP (GET /v1/findings)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import structlog

from .rules.findings import Finding

FINDINGS_TIMEOUT_S = 10.0


class FindingsSource:
    """Fetches inventory's findings and keeps the status of the last poll (shown by GET /v1/rules)."""

    def __init__(self, inventory_url: str, http: httpx.AsyncClient, log: structlog.typing.FilteringBoundLogger) -> None:
        self.url = inventory_url.rstrip("/") + "/v1/findings"
        self.http = http
        self.log = log
        self.status: dict[str, Any] = {"ok_at": None, "error": None, "error_at": None, "findings": 0}

    async def fetch(self, now: datetime) -> list[Finding] | None:
        """The findings; None when inventory did not answer with them (what fires stays as it is)."""
        try:
            resp = await self.http.get(self.url, timeout=FINDINGS_TIMEOUT_S)
            resp.raise_for_status()
            findings = resp.json()
            if not isinstance(findings, list) or not all(isinstance(f, dict) and "kind" in f for f in findings):
                raise ValueError("unexpected response shape (want a list of {kind, summary, detail, ...})")
        except (httpx.HTTPError, ValueError) as exc:
            self._failed(_describe(exc), now)
            return None
        self.status.update(ok_at=now.isoformat(), error=None, error_at=None, findings=len(findings))
        return findings

    def _failed(self, error: str, now: datetime) -> None:
        if error != self.status["error"]:
            self.log.warning("findings.poll_failed", error=error)
        self.status.update(error=error, error_at=now.isoformat())


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"inventory answered {exc.response.status_code}"
    if isinstance(exc, httpx.HTTPError):
        return type(exc).__name__  # not str(exc): it may carry the URL
    return f"{type(exc).__name__}: {str(exc)[:200]}"
