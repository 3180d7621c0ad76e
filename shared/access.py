"""Who may call what over HTTP: roles, principals, the tokens file and OIDC claims (pure; no I/O but the file).

Roles are ordered: viewer < submitter < operator < admin; a role can do everything the ones below it can.
A submitter submits (and cancels) jobs only for its teams; operators and admins for any team.

The tokens file (`WHALEFLUX_TOKENS_FILE`, JSON, mode 0600) holds hashes, never tokens:

    {"tokens": [{"name": "alice", "role": "submitter", "teams": ["vision"], "sha256": "…"},
                {"name": "scheduler", "role": "viewer", "services": ["inventory"], "sha256": "…"}]}

`services` (optional) lists the services that accept the token (a component's credential is accepted only
by those it calls); without it every service does. Tokens are random 256-bit values, so one SHA-256 is
the right hash (a slow password hash buys nothing against a guess that has 2^256 candidates).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

Role = Literal["viewer", "submitter", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
TOKEN_PREFIX = "wf_"  # noqa: S105 - not a secret: the prefix, so that secret scanners and people can tell a WhaleFlux token


class Refused(Exception):
    """A credential that identifies nobody; the message says why (safe to show: it never holds the token)."""


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, with what role and, for a submitter, which teams."""

    name: str
    role: Role
    teams: frozenset[str] | None = None  # a submitter's teams; None: every team (operator, admin)
    via: Literal["token", "oidc", "admin-token"] = "token"

    def has(self, role: Role) -> bool:
        """True when this principal's role is `role` or above it."""
        return ROLES.index(self.role) >= ROLES.index(role)

    def may_act_for(self, team: str) -> bool:
        """May submit or cancel jobs of `team`: an operator or admin always, a submitter for its teams."""
        if self.has("operator"):
            return True
        return self.role == "submitter" and (self.teams is None or team in self.teams)


class TokenEntry(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    role: Role
    teams: list[str] | None = None
    services: list[str] | None = None
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    def principal(self) -> Principal:
        teams = frozenset(self.teams) if self.role == "submitter" and self.teams is not None else None
        return Principal(self.name, self.role, teams, "token")


class TokenFile(BaseModel):
    tokens: list[TokenEntry] = Field(default_factory=list)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def find(tokens: TokenFile, given: str, service: str) -> Principal | None:
    """The principal whose token `given` is, if `service` accepts it. Every entry is compared in constant
    time, so how long it takes says nothing about which entry (or how much of a hash) matched."""
    digest = hash_token(given)
    found: TokenEntry | None = None
    for entry in tokens.tokens:
        if hmac.compare_digest(entry.sha256, digest) and found is None:
            found = entry
    if found is None or (found.services is not None and service not in found.services):
        return None
    return found.principal()


def read_tokens(path: Path, owners: Collection[int] = ()) -> TokenFile:
    """The tokens file; a missing file has no tokens. A file others can write is refused: whoever can write it
    can make themselves admin; so is one whose file or folder belongs to a user other than this process's, root
    or `owners` (a deployment tool reading the file it issued to a service's user)."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return TokenFile()
    if found.st_mode & 0o022:
        raise Refused(f"{path}: group or others may write it (chmod 600)")
    # Its owner and its folder's too: a file someone else owns, or that someone else could have replaced,
    # is theirs, whatever its mode.
    for what, stat_result in ((path, found), (path.parent, path.parent.stat())):
        if stat_result.st_uid not in (0, os.geteuid(), *owners):
            raise Refused(f"{what}: owned by uid {stat_result.st_uid}, not by this service's user or root (chown it)")
    if path.parent.stat().st_mode & 0o022:
        raise Refused(f"{path.parent}: group or others may write in it (chmod 700)")
    try:
        return TokenFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise Refused(f"{path}: not a tokens file ({exc.error_count()} errors)") from None


def write_tokens(path: Path, tokens: TokenFile) -> None:
    """Write the file atomically, mode 0600 (its folder 0700 when created here)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(tokens.model_dump_json(indent=2, exclude_none=True))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def issue(path: Path, name: str, role: Role, *, teams: Sequence[str] | None = None,
          services: Sequence[str] | None = None, token: str | None = None) -> str:
    """Add (or replace, by name) a token in the file and return it: the only time it is seen in clear."""
    if role == "submitter" and not teams:
        raise ValueError("a submitter needs at least one team (--team)")
    token = token or new_token()
    current = read_tokens(path)
    entry = TokenEntry(name=name, role=role, teams=list(teams) if teams else None,
                       services=list(services) if services else None, sha256=hash_token(token))
    write_tokens(path, TokenFile(tokens=[e for e in current.tokens if e.name != name] + [entry]))
    return token


def revoke(path: Path, name: str) -> bool:
    """Remove the token called `name`; False when there was none."""
    current = read_tokens(path)
    kept = [e for e in current.tokens if e.name != name]
    if len(kept) == len(current.tokens):
        return False
    write_tokens(path, TokenFile(tokens=kept))
    return True


@dataclass(frozen=True)
class ClaimNames:
    """Which claims of an OIDC token carry the person's name, role and teams."""

    name: str = "preferred_username"
    role: str = "whaleflux_role"
    teams: str = "whaleflux_teams"


def principal_from_claims(claims: Mapping[str, Any], names: ClaimNames) -> Principal:
    """The principal a verified token's claims describe. The role claim is one role or a list of them (the
    highest counts); the teams claim a list or a space-separated string."""
    raw_role = claims.get(names.role)
    listed = raw_role if isinstance(raw_role, list) else [raw_role]
    roles = [r for r in listed if isinstance(r, str) and r in ROLES]
    if not roles:
        raise Refused(f"bearer token: claim {names.role!r} names no role ({', '.join(ROLES)})")
    role: Role = max(roles, key=ROLES.index)
    raw_teams = claims.get(names.teams)
    if isinstance(raw_teams, str):
        team_list = raw_teams.split()
    elif isinstance(raw_teams, list):
        team_list = [t for t in raw_teams if isinstance(t, str)]
    else:
        team_list = []
    if role == "submitter" and not team_list:
        raise Refused(f"bearer token: a submitter needs teams in claim {names.teams!r}")
    name = claims.get(names.name) or claims.get("sub")
    if not isinstance(name, str) or not name:
        raise Refused(f"bearer token: no {names.name!r} or 'sub' claim")
    return Principal(name, role, frozenset(team_list) if role == "submitter" else None, "oidc")


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and not token.startswith(TOKEN_PREFIX)


def audit_entry(*, time: str, service: str, principal: Principal | None, method: str, path: str,
                status: int) -> str:
    """One line of the audit log (JSON): who, what, when, and how it ended."""
    who = ({"name": principal.name, "role": principal.role, "via": principal.via}
           if principal is not None else None)
    return json.dumps({"time": time, "service": service, "who": who, "method": method, "path": path,
                       "status": status, "result": "ok" if status < 400 else "refused" if status in (401, 403)
                       else "failed"}, separators=(",", ":"))
