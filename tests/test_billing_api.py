"""Billing's API refuses a bad report window with 400 naming the field, before it reads anything."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from whaleflux.billing.app import BillingSettings, build

NOW = datetime(2026, 3, 20, tzinfo=UTC)


async def test_a_split_cost_allocation_by_anything_but_team_or_project_is_a_422_naming_the_field():
    app, _ = build(BillingSettings(), clock=lambda: NOW)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing") as http:
        resp = await http.get("/v1/costs/export", params={"format": "focus", "share_idle_by": "job"})
    assert resp.status_code == 422, resp.text
    assert "share_idle_by" in resp.text


@pytest.mark.parametrize("params, expected", [
    ({"from": "2026-03-10T00:00:00", "to": "2026-03-11T00:00:00Z"}, "from: give a timezone"),
    ({"from": "2026-03-10T00:00:00Z", "to": "2026-03-09T00:00:00Z"}, "from/to: `to` must be after `from`"),
    ({"from": "2025-01-01T00:00:00Z", "to": "2026-03-01T00:00:00Z"}, "from/to: at most 400 days"),
])
async def test_a_bad_window_is_a_400_naming_the_field(params, expected):
    # Never connected (no lifespan): the window is checked before the store is asked anything.
    app, _ = build(BillingSettings(), clock=lambda: NOW)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing") as http:
        for path in ("/v1/costs", "/v1/costs/export"):
            resp = await http.get(path, params=params)
            assert resp.status_code == 400, resp.text
            assert resp.json()["detail"].startswith(expected)
