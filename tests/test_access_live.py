"""Roles on representative routes of every service, running on real NATS and Redis (issue 18, Deliver 2):
401 without a token, 403 with a weaker role, the route's answer with the right one; a submitter only for its
teams; a component's token only where it calls; an OIDC token from a local issuer; the audit log.

The services run with the test's servers, which have no Redis password, so not in production mode: each app's
reads are switched to production's rule (`reads_need_role`, which production sets: tests/test_access.py).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .processes import until
from .test_access import AUDIENCE, ISSUER, Issuer


@pytest.fixture
def issuer():
    idp = Issuer()
    yield idp
    idp.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def serving(name: str, tokens: str, audit: Path, **extra: Any) -> AsyncIterator[httpx.ASGITransport]:
    """Service `name` in this process with production's rule for reads, ready; its app as a transport."""
    module = importlib.import_module(f"whaleflux.{name}.app")
    settings_type = next(v for k, v in vars(module).items() if k.endswith("Settings") and isinstance(v, type))
    app, _ = module.build(settings_type(tokens_file=Path(tokens), audit_log=audit, **extra))
    app.state.access.reads_need_role = True  # production's rule for reads
    runtime = app.state.runtime
    await runtime.start()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{name}") as client:
            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200
            await until(ready, timeout=60, what=f"{name} ready")
        yield transport
    finally:
        await runtime.stop()


@asynccontextmanager
async def running(name: str, tokens: str, audit: Path, **extra: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(name, tokens, audit, **extra) as transport:
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{name}", timeout=30) as client:
            yield client


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_scheduler_roles_teams_and_an_oidc_viewer(env, people, issuer, tmp_path):
    audit = tmp_path / "audit.jsonl"
    oidc = {"oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, "oidc_jwks_url": issuer.jwks_url}
    async with running("scheduler", people["path"], audit, **oidc) as http:
        assert (await http.get("/v1/jobs")).status_code == 401
        assert (await http.get("/v1/jobs", headers=bearer(people["viewer"]))).status_code == 200
        assert (await http.get("/v1/jobs", headers=bearer(issuer.token()))).status_code == 200
        wrong_key = issuer.token(key=Issuer().key)
        assert (await http.get("/v1/jobs", headers=bearer(wrong_key))).status_code == 401
        job = {"name": "train", "team": "nlp", "gpus": 1, "command": ["true"]}
        weak = await http.post("/v1/jobs", json=job, headers=bearer(people["viewer"]))
        assert weak.status_code == 403 and "submitter" in weak.json()["detail"]
        other_team = await http.post("/v1/jobs", json=job, headers=bearer(people["submitter"]))
        assert other_team.status_code == 403 and "'nlp'" in other_team.json()["detail"]
        own_team = await http.post("/v1/jobs", json={**job, "team": "vision"}, headers=bearer(people["submitter"]))
        assert own_team.status_code == 202 and own_team.json()["job_id"]
        drain = await http.post("/v1/nodes/n1/drain", headers=bearer(people["submitter"]))
        assert drain.status_code == 403 and "operator" in drain.json()["detail"]
        assert (await http.post("/v1/nodes/n1/drain", headers=bearer(people["operator"]))).status_code == 404
        assert (await http.get("/admin/status", headers=bearer(people["operator"]))).status_code == 403
        assert (await http.get("/admin/status", headers=bearer(people["admin"]))).status_code == 200
    entries = _audit(audit)
    assert [(e["who"]["name"] if e["who"] else None, e["path"], e["status"]) for e in entries] == [
        ("vic", "/v1/jobs", 403), ("sam", "/v1/jobs", 403), ("sam", "/v1/jobs", 202),
        ("sam", "/v1/nodes/n1/drain", 403), ("olga", "/v1/nodes/n1/drain", 404)]


async def test_an_operator_silences_a_viewer_reads_and_the_audit_log_says_who(env, people, tmp_path):
    audit = tmp_path / "audit" / "alerting.jsonl"
    silence = {"matchers": ["node=h100-01"], "duration": "1h", "created_by": "olga", "comment": "maintenance"}
    async with running("alerting", people["path"], audit) as http:
        assert (await http.post("/v1/silences", json=silence)).status_code == 401
        assert (await http.post("/v1/silences", json=silence, headers=bearer(people["viewer"]))).status_code == 403
        made = await http.post("/v1/silences", json=silence, headers=bearer(people["operator"]))
        assert made.status_code == 201
        assert (await http.get("/v1/silences")).status_code == 401
        listed = await http.get("/v1/silences", headers=bearer(people["viewer"]))
        assert [s["id"] for s in listed.json()] == [made.json()["id"]]
        reload = await http.post("/admin/rules/reload", headers=bearer(people["operator"]))
        assert reload.status_code == 403 and "admin" in reload.json()["detail"]
    first, second, third, fourth = _audit(audit)
    assert first["who"] is None and first["result"] == "refused"
    assert second["who"] == {"name": "vic", "role": "viewer", "via": "token"} and second["status"] == 403
    assert third["who"] == {"name": "olga", "role": "operator", "via": "token"}
    assert (third["method"], third["path"], third["status"], third["result"]) == ("POST", "/v1/silences", 201, "ok")
    assert third["service"] == "alerting" and third["time"].startswith("20")
    assert fourth["path"] == "/admin/rules/reload" and fourth["result"] == "refused"


async def test_billing_prices_need_a_viewer_to_read_and_an_admin_to_change(env, people, tmp_path):
    async with running("billing", people["path"], tmp_path / "audit.jsonl") as http:
        assert (await http.get("/v1/pricebook")).status_code == 401
        assert (await http.get("/v1/costs", headers=bearer(people["viewer"]))).status_code == 200
        assert (await http.get("/v1/pricebook", headers=bearer(people["viewer"]))).status_code == 200
        book = "prices: nonsense"
        weak = await http.put("/admin/pricebook", content=book, headers=bearer(people["operator"]))
        assert weak.status_code == 403
        allowed = await http.put("/admin/pricebook", content=book, headers=bearer(people["admin"]))
        assert allowed.status_code == 422  # past the gate: the YAML is not a price book
        # The scheduler's component token is accepted by inventory only.
        assert (await http.get("/v1/costs", headers=bearer(people["scheduler"]))).status_code == 401


async def test_inventory_takes_a_components_token_and_telemetry_wants_a_viewer(env, people, tmp_path):
    async with running("inventory", people["path"], tmp_path / "audit.jsonl") as http:
        assert (await http.get("/v1/leases")).status_code == 401
        assert (await http.get("/v1/leases", headers=bearer(people["scheduler"]))).status_code == 200
        assert (await http.put("/admin/assets", content="{}", headers=bearer(people["scheduler"]))).status_code == 403
    async with running("telemetry", people["path"], tmp_path / "audit.jsonl") as http:
        assert (await http.get("/v1/fleet")).status_code == 401
        assert (await http.get("/v1/fleet", headers=bearer("wf_" + "x" * 43))).status_code == 401
        assert (await http.get("/v1/fleet", headers=bearer(people["viewer"]))).status_code == 200
        assert (await http.get("/healthz")).status_code == 200


async def test_the_consoles_background_reads_carry_a_viewer_token_that_may_change_nothing(env, people, tmp_path):
    """The console's own reads (the fleet's node states, its GPUs: shared by every browser) carry its viewer token,
    not an admin's and not the person's whose request set them off; that token is refused for any change."""
    from pydantic import SecretStr

    from whaleflux.console.app import create_app
    from whaleflux.console.settings import ConsoleSettings
    from whaleflux.console.upstream import UpstreamError, acting_as
    from whaleflux.shared import access
    from whaleflux.shared.localconfig import SERVICES

    reader = access.issue(Path(people["path"]), "console", "viewer", services=list(SERVICES))
    own_admin = access.new_token()  # the console's own: accepted by the console alone, as `up` issues it

    def console(reads_with: str | None = None):
        settings = ConsoleSettings(tokens_file=Path(people["path"]), scheduler_url="http://scheduler",
                                   telemetry_url="http://telemetry", admin_token=SecretStr(own_admin),
                                   api_token=SecretStr(reads_with) if reads_with else None)
        state = create_app(settings).state.console
        state.upstream.http = httpx.AsyncClient(mounts={f"http://{n}": t for n, t in services.items()}, timeout=30)
        return state

    async with (serving("scheduler", people["path"], tmp_path / "s.jsonl") as scheduler,
                serving("telemetry", people["path"], tmp_path / "t.jsonl") as telemetry):
        services = {"scheduler": scheduler, "telemetry": telemetry}
        ours = console(reads_with=reader)
        acting_as.set("wf_" + "n" * 43)  # a person's request set the read off: it is still the console's own
        assert await ours.fleet.node_statuses() == [] and await ours.fleet.ready() == []
        acting_as.set(None)
        job = {"name": "x", "team": "vision", "gpus": 1, "command": ["true"]}
        with pytest.raises(UpstreamError) as refused:
            await ours.upstream.post("scheduler", "/v1/jobs", job)
        assert refused.value.status == 403 and "submitter" in refused.value.detail
        with pytest.raises(UpstreamError) as drain:
            await ours.upstream.post("scheduler", "/v1/nodes/n1/drain", {})
        assert drain.value.status == 403
        # Without a reader token it falls back to its admin token, which no other service takes.
        with pytest.raises(UpstreamError) as fallback:
            await console().fleet.node_statuses()
        assert fallback.value.detail.startswith("401: needs role viewer")
