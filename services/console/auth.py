"""Login with a person's own token, a signed HttpOnly session cookie, and CSRF tokens bound to the session.

The cookie carries its expiry and a random session id, signed with a key derived from the console's admin token
(rotating that token ends every session). Who the session is, and the credential the console calls the services
with on that person's behalf, are kept in this process only (`Sessions`): never in the cookie, never in a URL.
A restarted console (or another replica) asks the person to log in again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

SESSION_COOKIE = "wf_session"
LOGIN_COOKIE = "wf_login"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Session:
    sid: str
    expires: int

    def csrf(self, key: bytes) -> str:
        """The CSRF token of this session: every form and htmx request must carry it."""
        return _mac(key, f"csrf:{self.sid}")


@dataclass(frozen=True)
class Person:
    """Who logged in, and the credential (their own token or OIDC bearer) the console sends for them."""

    name: str
    role: str
    via: str
    credential: str = field(repr=False)


class Sessions:
    """Each live session's person, in this process's memory; expired ones are dropped as new ones come."""

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self._by_sid: dict[str, tuple[Person, int]] = {}

    def add(self, session: Session, person: Person, now: float | None = None) -> None:
        now = now or time.time()
        if len(self._by_sid) >= self.limit:
            self._by_sid = {sid: v for sid, v in self._by_sid.items() if v[1] >= now}
        while len(self._by_sid) >= self.limit:  # still full of live sessions: the oldest one ends
            self._by_sid.pop(next(iter(self._by_sid)))
        self._by_sid[session.sid] = (person, session.expires)

    def person(self, session: Session, now: float | None = None) -> Person | None:
        found = self._by_sid.get(session.sid)
        if found is None or found[1] < (now or time.time()):
            self._by_sid.pop(session.sid, None)
            return None
        return found[0]

    def end(self, session: Session) -> None:
        self._by_sid.pop(session.sid, None)

    def __len__(self) -> int:
        return len(self._by_sid)


class Signer:
    """Signs and checks session cookies and CSRF tokens with a key derived from the admin token."""

    def __init__(self, admin_token: str):
        self.key = hashlib.sha256(b"whaleflux-console-session:" + admin_token.encode()).digest()

    def new_session(self, lifetime_s: float, now: float | None = None,
                    ends: float | None = None) -> tuple[Session, str]:
        """A fresh session and its cookie value; it ends after `lifetime_s`, or at `ends` if that is sooner (an OIDC
        token's expiry)."""
        end = (now or time.time()) + lifetime_s
        session = Session(secrets.token_urlsafe(16), int(min(end, ends) if ends is not None else end))
        body = f"{session.sid}.{session.expires}"
        return session, f"{body}.{_mac(self.key, body)}"

    def session(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie names, or None when it is missing, forged or expired."""
        if not cookie or cookie.count(".") != 2:
            return None
        sid, expires, mac = cookie.split(".")
        if not hmac.compare_digest(mac, _mac(self.key, f"{sid}.{expires}")):
            return None
        if not expires.isdigit() or int(expires) < (now or time.time()):
            return None
        return Session(sid, int(expires))

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return given is not None and given != "" and hmac.compare_digest(given, session.csrf(self.key))

    def login_csrf(self, nonce: str) -> str:
        """The login form's token, bound to a pre-login cookie (nobody can log a browser in from another site)."""
        return _mac(self.key, f"login:{nonce}")


def _mac(key: bytes, text: str) -> str:
    digest = hmac.new(key, text.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def safe_next(path: str | None) -> str:
    """Where to go after login: a path on this site only (no open redirect)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def served_over_tls(scheme: str, forwarded_proto: str | None, trust_forwarded: bool) -> bool:
    """Whether the browser reached the console over HTTPS: its own scheme, or, when the console is told to trust
    its proxy (`WHALEFLUX_TRUST_FORWARDED_PROTO`), the proxy's X-Forwarded-Proto (its first value: the client's
    side of the first proxy). A header from anyone else is ignored: a client could send it itself."""
    if scheme == "https":
        return True
    first = (forwarded_proto or "").split(",")[0].strip().lower()
    return trust_forwarded and first == "https"
