"""Login with the admin token, a signed HttpOnly session cookie, and CSRF tokens bound to the session.

Stateless on purpose: the cookie carries its expiry and a random session id, signed with a key
derived from the admin token, so any console replica (or a restarted one) accepts it, and rotating
the admin token ends every session. The token itself never leaves the server and is never in a URL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

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


class Signer:
    """Signs and checks session cookies and CSRF tokens with a key derived from the admin token."""

    def __init__(self, admin_token: str):
        self.key = hashlib.sha256(b"whaleflux-console-session:" + admin_token.encode()).digest()
        self._token = admin_token.encode()

    def token_matches(self, given: str) -> bool:
        return secrets.compare_digest(given.encode(), self._token)

    def new_session(self, lifetime_s: float, now: float | None = None) -> tuple[Session, str]:
        """A fresh session and its cookie value."""
        session = Session(secrets.token_urlsafe(16), int((now or time.time()) + lifetime_s))
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
