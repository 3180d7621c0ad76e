"""The HTTP side of `shared.access`: who a bearer token is, the role each route needs, and the audit log.

Every WhaleFlux app (the services through `Runtime.app`, the agent in its `create_app`) calls `install_access`;
routes then use the dependencies of `shared.deps` (`ViewerDep`, `SubmitterDep`, `OperatorDep`, `AdminDep`).

A bearer token is, in this order: the process's own admin token (`WHALEFLUX_ADMIN_TOKEN`, role admin), a token
of the tokens file (`WHALEFLUX_TOKENS_FILE`, re-read when it changes), or an OIDC token (a JWT) verified
against the issuer's JWKS (`WHALEFLUX_OIDC_ISSUER`, `..._AUDIENCE`, `..._JWKS_URL`).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import structlog
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .access import (
    ClaimNames,
    Principal,
    Refused,
    Role,
    TokenFile,
    audit_entry,
    find,
    looks_like_jwt,
    principal_from_claims,
    read_tokens,
)
from .settings import CommonSettings

_bearer = HTTPBearer(auto_error=False, description="a WhaleFlux token or an OIDC token (docs/security.md)")
# Asymmetric signatures only: an HMAC algorithm would let anyone holding the public key sign.
OIDC_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
_UNSAFE = frozenset({"GET", "HEAD", "OPTIONS"})
log = structlog.get_logger("whaleflux.audit")


class OidcVerifier:
    """Verifies a JWT's signature (by the issuer's JWKS, fetched and cached by PyJWT), expiry, issuer and
    audience, and maps its claims to a principal."""

    def __init__(self, issuer: str, audience: str, jwks_url: str, names: ClaimNames) -> None:
        import jwt  # here: PyJWT loads `cryptography`, which a process without OIDC need not start with

        self.issuer, self.audience, self.names = issuer, audience, names
        self.jwks = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300, timeout=5)

    def principal(self, token: str) -> Principal:
        import jwt

        try:
            key = self.jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=OIDC_ALGORITHMS, issuer=self.issuer,
                                audience=self.audience, leeway=30,
                                options={"require": ["exp", "iss", "aud", "iat"]})
        except jwt.PyJWKClientConnectionError:
            raise Refused("bearer token: the issuer's keys cannot be fetched now") from None
        except jwt.ExpiredSignatureError:
            raise Refused("bearer token: expired") from None
        except jwt.InvalidIssuerError:
            raise Refused("bearer token: not from the configured issuer") from None
        except jwt.InvalidAudienceError:
            raise Refused("bearer token: not for this audience") from None
        except (jwt.PyJWKClientError, jwt.InvalidSignatureError):
            raise Refused("bearer token: not signed by a key of the issuer") from None
        except jwt.InvalidTokenError as exc:
            raise Refused(f"bearer token: {type(exc).__name__}") from None
        return principal_from_claims(claims, self.names)


class Access:
    """One app's authenticator and audit log, built from its settings."""

    def __init__(self, service: str, settings: CommonSettings, clock: Callable[[], datetime] | None = None) -> None:
        self.service = service
        self.reads_need_role = settings.environment == "production"
        self._admin = (settings.secret("admin_token") or "").encode()
        self._tokens_path = settings.tokens_file
        self._tokens: tuple[float, TokenFile] | None = None
        self._lock = threading.Lock()
        self.oidc = (OidcVerifier(settings.oidc_issuer, settings.oidc_audience or "", settings.oidc_jwks_url or "",
                                  ClaimNames(settings.oidc_name_claim, settings.oidc_role_claim,
                                             settings.oidc_teams_claim))
                     if settings.oidc_issuer else None)
        self.audit_path = settings.audit_log
        self.clock = clock or (lambda: datetime.now(UTC))

    def tokens(self) -> TokenFile:
        """The tokens file, re-read when its modification time changes (a token issued or revoked while the
        service runs counts from the next request)."""
        if self._tokens_path is None:
            return TokenFile()
        try:
            mtime = self._tokens_path.stat().st_mtime_ns
        except FileNotFoundError:
            return TokenFile()
        with self._lock:
            if self._tokens is None or self._tokens[0] != mtime:
                self._tokens = (mtime, read_tokens(self._tokens_path))
            return self._tokens[1]

    def identify(self, token: str) -> Principal | None:
        """Who `token` is, or None when it is nobody's; Refused (with the reason) for a bad OIDC token."""
        if self._admin and hmac.compare_digest(token.encode(), self._admin):
            return Principal("admin-token", "admin", None, "admin-token")
        found = find(self.tokens(), token, self.service)
        if found is not None:
            return found
        if self.oidc is not None and looks_like_jwt(token):
            return self.oidc.principal(token)
        return None

    def audit(self, principal: Principal | None, method: str, path: str, status: int) -> None:
        line = audit_entry(time=self.clock().isoformat(), service=self.service, principal=principal,
                           method=method, path=path, status=status)
        log.info("audit", service=self.service, who=principal.name if principal else None, method=method,
                 path=path, status=status)
        if self.audit_path is None:
            return
        self.audit_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with contextlib.closing(os.fdopen(fd, "a")) as fh:
            fh.write(line + "\n")  # one write of one line: appends from several processes do not interleave


def access_of(request: Request) -> Access:
    access = getattr(request.app.state, "access", None)
    if not isinstance(access, Access):
        raise RuntimeError("this app has no access control: call install_access(app, ...)")
    return access


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


_DEPENDENCIES: dict[Role, Callable[..., Principal | None]] = {}


def require_role(role: Role) -> Callable[..., Principal | None]:
    """A dependency: 401 without a valid bearer token, 403 when its role is below `role`. For `viewer`, only
    in production (development keeps reads open). The principal is kept on the request for the audit log.
    One function per role: FastAPI then checks a role once per request, however many routers name it."""
    if role in _DEPENDENCIES:
        return _DEPENDENCIES[role]

    def dependency(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal | None:
        access = access_of(request)
        if role == "viewer" and not access.reads_need_role and credentials is None:
            return None
        if credentials is None:
            raise _unauthorized(f"needs role {role} or above: no bearer token (Authorization: Bearer <token>)")
        try:
            principal = access.identify(credentials.credentials)
        except Refused as exc:
            raise _unauthorized(str(exc)) from None
        if principal is None:
            raise _unauthorized(f"needs role {role} or above: the bearer token is nobody's")
        request.state.principal = principal
        if not principal.has(role):
            raise HTTPException(403, f"needs role {role} or above; {principal.name} is {principal.role}")
        return principal

    dependency.__name__ = f"require_{role}"
    _DEPENDENCIES[role] = dependency
    return dependency


def require_team(principal: Principal | None, team: str) -> None:
    """403 naming the team unless `principal` may submit or cancel jobs of `team`."""
    if principal is not None and not principal.may_act_for(team):
        teams = ", ".join(sorted(principal.teams or ()))
        raise HTTPException(403, f"team: {principal.name} may act for {teams or 'no team'}, not {team!r}")


def install_access(app: FastAPI, service: str, settings: CommonSettings,
                   clock: Callable[[], datetime] | None = None) -> Access:
    """Put the authenticator on `app` and audit every state-changing request (allowed or refused)."""
    access = Access(service, settings, clock)
    app.state.access = access

    @app.middleware("http")
    async def audited(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if request.method not in _UNSAFE and request.url.path.startswith(("/v1/", "/admin/", "/api/")):
            principal: Any = getattr(request.state, "principal", None)
            access.audit(principal if isinstance(principal, Principal) else None, request.method,
                         request.url.path, response.status_code)
        return response

    return access
