"""POST a rendered body to a receiver's URL (the pipeline's one piece of network I/O)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx

from .model import DeliveryError, retry_after

POST_TIMEOUT_S = 5.0


async def post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any] | list[dict[str, Any]],
                    clock: Callable[[], datetime]) -> int:
    """The receiver's status code; DeliveryError saying whether a retry can help (5xx, 429, no connection).
    A `Retry-After` (seconds or an HTTP-date) counts from when the answer came (`clock` read then)."""
    try:
        resp = await client.post(url, json=body, timeout=POST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        # The URL may hold a token: name the error type only.
        raise DeliveryError(f"{type(exc).__name__} posting", retryable=True) from None
    if resp.status_code >= 500 or resp.status_code == 429:
        received = clock()
        at = retry_after(resp.headers.get("Retry-After"), received)
        raise DeliveryError(f"receiver answered {resp.status_code}", retryable=True, status=resp.status_code,
                            retry_after_s=(at - received).total_seconds() if at else None, retry_at=at)
    if resp.status_code >= 400:
        raise DeliveryError(f"receiver answered {resp.status_code}", retryable=False, status=resp.status_code)
    return resp.status_code
