"""The scheduler's HTTP API before its replica has connected: typed answers, never a 500 (no lifespan, no servers)."""

from __future__ import annotations

import httpx

from whaleflux.scheduler.app import SchedulerSettings, build

TOKEN = "t" * 32


def _client() -> httpx.AsyncClient:
    app, _ = build(SchedulerSettings(admin_token=TOKEN))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://scheduler")


async def test_reads_and_submissions_before_the_store_is_connected_get_503_with_the_reason():
    async with _client() as client:
        jobs = await client.get("/v1/jobs")
        nodes = await client.get("/v1/nodes")
        submit = await client.post("/v1/jobs", json={"name": "x", "command": ["true"]},
                                   headers={"Authorization": f"Bearer {TOKEN}"})
    for r in (jobs, nodes, submit):
        assert r.status_code == 503, r.text
        assert r.json()["detail"] == "scheduler cannot answer now: the scheduler is not connected to its store yet"


async def test_a_replica_not_yet_connected_is_a_standby_that_knows_no_leader():
    async with _client() as client:
        r = await client.get("/v1/leader")
    assert r.status_code == 200 and r.json() == {"role": "standby", "me": None, "leader": None, "token": None}


async def test_admin_routes_want_the_token_before_anything_else():
    async with _client() as client:
        none = await client.post("/v1/jobs", json={"name": "x", "command": ["true"]})
        wrong = await client.post("/v1/nodes/n1/drain", headers={"Authorization": "Bearer nope"})
    assert none.status_code == 401 and wrong.status_code == 401
