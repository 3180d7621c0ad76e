"""People over HTTP (issue 18, Deliver 2): roles, the hashed tokens file, OIDC tokens verified against a JWKS
served by a local issuer the test starts, and the audit log. The routes of the services are in
tests/test_access_routes.py."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from whaleflux.agent.app import AgentSettings, create_app
from whaleflux.shared import access
from whaleflux.shared.access import ClaimNames, Principal, Refused, principal_from_claims
from whaleflux.shared.access_http import Access
from whaleflux.shared.settings import CommonSettings

SECRET = "s" * 24


def test_roles_are_ordered_and_a_submitter_acts_only_for_its_teams():
    viewer = Principal("v", "viewer")
    submitter = Principal("s", "submitter", frozenset({"vision"}))
    operator = Principal("o", "operator")
    assert viewer.has("viewer") and not viewer.has("submitter")
    assert submitter.has("viewer") and submitter.has("submitter") and not submitter.has("operator")
    assert operator.has("submitter") and not operator.has("admin")
    assert submitter.may_act_for("vision") and not submitter.may_act_for("nlp")
    assert operator.may_act_for("nlp") and not viewer.may_act_for("vision")


def test_the_tokens_file_holds_hashes_only_is_private_and_names_whom_it_accepts(tmp_path):
    path = tmp_path / "secrets" / "tokens.json"
    alice = access.issue(path, "alice", "submitter", teams=["vision"])
    sched = access.issue(path, "scheduler", "viewer", services=["inventory"])
    text = path.read_text()
    assert alice not in text and sched not in text and access.hash_token(alice) in text
    assert os.stat(path).st_mode & 0o777 == 0o600
    tokens = access.read_tokens(path)
    assert access.find(tokens, alice, "scheduler") == Principal("alice", "submitter", frozenset({"vision"}))
    assert access.find(tokens, sched, "inventory") == Principal("scheduler", "viewer")
    assert access.find(tokens, sched, "billing") is None  # a component's token: only where it calls
    assert access.find(tokens, alice + "x", "scheduler") is None
    # Issuing again under a name replaces the old token; revoking removes it.
    alice2 = access.issue(path, "alice", "operator")
    tokens = access.read_tokens(path)
    assert access.find(tokens, alice, "scheduler") is None
    assert access.find(tokens, alice2, "x") == Principal("alice", "operator")
    assert access.revoke(path, "alice") and not access.revoke(path, "alice")
    assert access.find(access.read_tokens(path), alice2, "x") is None


def test_a_tokens_file_others_may_write_is_refused_and_a_submitter_needs_teams(tmp_path):
    path = tmp_path / "tokens.json"
    access.issue(path, "bob", "viewer")
    path.chmod(0o666)
    with pytest.raises(Refused, match="chmod 600"):
        access.read_tokens(path)
    with pytest.raises(ValueError, match="team"):
        access.issue(tmp_path / "other.json", "carol", "submitter")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the file to another user needs root")
def test_a_tokens_file_another_user_owns_or_could_replace_is_refused_whatever_its_mode(tmp_path):
    # A job that once owned the folder could have put its own file there, mode 0600 and all (issue 36).
    path = tmp_path / "secrets" / "tokens.json"
    access.issue(path, "bob", "viewer")
    os.chown(path, 61184, 61184)
    with pytest.raises(Refused, match="owned by uid 61184"):
        access.read_tokens(path)
    os.chown(path, 0, 0)
    os.chown(path.parent, 61184, 61184)
    with pytest.raises(Refused, match=r"secrets: owned by uid 61184"):
        access.read_tokens(path)
    os.chown(path.parent, 0, 0)
    path.parent.chmod(0o777)
    with pytest.raises(Refused, match="may write in it"):
        access.read_tokens(path)
    path.parent.chmod(0o700)
    assert access.read_tokens(path).tokens


def test_claims_map_to_a_role_and_teams_by_the_documented_claim_names():
    names = ClaimNames()
    p = principal_from_claims({"sub": "u1", "preferred_username": "dana", "whaleflux_role": ["viewer", "submitter"],
                               "whaleflux_teams": "vision nlp"}, names)
    assert p == Principal("dana", "submitter", frozenset({"vision", "nlp"}), "oidc")
    assert principal_from_claims({"sub": "u2", "whaleflux_role": "admin"}, names).name == "u2"
    with pytest.raises(Refused, match="names no role"):
        principal_from_claims({"sub": "u3", "whaleflux_role": "root"}, names)
    with pytest.raises(Refused, match="needs teams"):
        principal_from_claims({"sub": "u4", "whaleflux_role": "submitter"}, names)
    custom = ClaimNames(name="email", role="groups", teams="projects")
    assert principal_from_claims({"email": "e@x", "groups": ["operator"]}, custom).role == "operator"


def test_production_needs_a_role_for_reads_and_development_keeps_them_open():
    prod = CommonSettings(environment="production", admin_token=SECRET, nats_password=SECRET, redis_password=SECRET)
    assert Access("scheduler", prod).reads_need_role
    assert not Access("scheduler", CommonSettings()).reads_need_role
    # With a tokens file (or OIDC), production does not need a shared admin token.
    CommonSettings(environment="production", tokens_file=Path("/nonexistent"), nats_password=SECRET,
                   redis_password=SECRET)
    with pytest.raises(ValueError, match="OIDC_AUDIENCE"):
        CommonSettings(oidc_issuer="https://id.example")
    # The console signs its sessions with its admin token: a tokens file does not excuse it.
    from whaleflux.console.settings import ConsoleSettings

    with pytest.raises(ValueError, match="WHALEFLUX_ADMIN_TOKEN"):
        ConsoleSettings(environment="production", tokens_file=Path("/nonexistent"), nats_password=SECRET)


# ---------------------------------------------------------------- OIDC against a local issuer

ISSUER = "https://id.test.example"
AUDIENCE = "whaleflux"


class Issuer:
    """A tiny identity provider: one RSA key, its JWKS served over HTTP, tokens signed with it."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()
        self.fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                issuer.fetches += 1
                self.send_response(200 if self.path == "/jwks.json" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body if self.path == "/jwks.json" else b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.jwks_url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def token(self, key: rsa.RSAPrivateKey | None = None, ttl: float = 300, **claims: object) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + int(ttl), "sub": "u-1",
                "preferred_username": "erin", "whaleflux_role": "viewer", **claims}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": "k1"})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    idp = Issuer()
    yield idp
    idp.stop()


def _oidc_access(issuer: Issuer) -> Access:
    settings = CommonSettings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE, oidc_jwks_url=issuer.jwks_url)
    return Access("scheduler", settings)


def test_an_oidc_token_signed_by_the_issuers_key_is_accepted_with_its_role_and_teams(issuer):
    gate = _oidc_access(issuer)
    p = gate.identify(issuer.token(whaleflux_role="submitter", whaleflux_teams=["vision"]))
    assert p == Principal("erin", "submitter", frozenset({"vision"}), "oidc")
    gate.identify(issuer.token())
    assert issuer.fetches == 1  # the JWKS is cached, not fetched for every request


@pytest.mark.parametrize(("make", "reason"), [
    (lambda i: i.token(ttl=-120), "expired"),
    (lambda i: i.token(iss="https://evil.example"), "issuer"),
    (lambda i: i.token(aud="another-app"), "audience"),
    (lambda i: i.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048)), "not signed"),
    (lambda i: jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60, "iat": int(time.time()),
                           "whaleflux_role": "admin"}, "k" * 32, algorithm="HS256", headers={"kid": "k1"}),
     "not signed|InvalidAlgorithm|InvalidKey"),
])
def test_an_expired_foreign_or_wrongly_signed_oidc_token_is_refused(issuer, make, reason):
    with pytest.raises(Refused, match=reason):
        _oidc_access(issuer).identify(make(issuer))


async def test_the_agent_in_production_wants_a_viewer_for_reads_and_an_operator_for_faults(issuer, tmp_path):
    """The agent's app needs no Redis, so it runs here with production settings as deployed."""
    tokens, audit = tmp_path / "tokens.json", tmp_path / "audit" / "agent.jsonl"
    viewer = access.issue(tokens, "vic", "viewer")
    operator = access.issue(tokens, "olga", "operator")
    settings = AgentSettings(environment="production", admin_token=SECRET, nats_password=SECRET, tokens_file=tokens,
                             audit_log=audit, oidc_issuer=ISSUER, oidc_audience=AUDIENCE,
                             oidc_jwks_url=issuer.jwks_url)
    app = create_app([], settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        assert (await http.get("/v1/faults")).status_code == 401
        assert (await http.get("/v1/faults", headers=bearer("wf_nobody"))).status_code == 401
        assert (await http.get("/v1/faults", headers=bearer(viewer))).status_code == 200
        assert (await http.get("/v1/faults", headers=bearer(issuer.token()))).status_code == 200
        expired = await http.get("/v1/faults", headers=bearer(issuer.token(ttl=-120)))
        assert expired.status_code == 401 and "expired" in expired.json()["detail"]
        fault = {"kind": "node-silent", "node": "n1"}
        assert (await http.post("/admin/faults", json=fault)).status_code == 401
        weak = await http.post("/admin/faults", json=fault, headers=bearer(viewer))
        assert weak.status_code == 403 and "operator" in weak.json()["detail"]
        allowed = await http.post("/admin/faults", json=fault, headers=bearer(operator))
        assert allowed.status_code == 404  # past the gate: this agent runs no node n1
        assert (await http.get("/healthz")).status_code == 200  # health stays open
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["who"] and e["who"]["name"], e["status"], e["result"]) for e in entries] == [
        (None, 401, "refused"), ("vic", 403, "refused"), ("olga", 404, "failed")]
    assert all(e["service"] == "agent" and e["path"] == "/admin/faults" and e["time"] for e in entries)
    assert os.stat(audit).st_mode & 0o777 == 0o600
