"""Login with one's own token (the tokens file, the console's admin token) or an OIDC bearer token, and logout.

The console checks the token as the services do (shared/access_http.Access) and keeps it server-side with the
session, so every page and action a person takes goes to the services with their credential: their role applies
there, and the services' audit logs name them.
"""

from __future__ import annotations

import secrets
from typing import Annotated

import jwt
from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from whaleflux.shared.access import Refused, looks_like_jwt

from ..auth import LOGIN_COOKIE, SESSION_COOKIE, Person, safe_next, served_over_tls
from ..web import Console, ConsoleDep, CsrfDep, page

router = APIRouter()


def _secure(request: Request, c: Console) -> bool:
    """Cookies for HTTPS only when the browser came over HTTPS (or the settings say always)."""
    return c.settings.cookie_secure or served_over_tls(
        request.url.scheme, request.headers.get("x-forwarded-proto"), c.settings.trust_forwarded_proto)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, c: ConsoleDep, next: str = "/") -> Response:
    nonce = secrets.token_urlsafe(16)
    resp = page(request, "login.html", next=safe_next(next), login_csrf=c.signer.login_csrf(nonce), error=None)
    resp.set_cookie(LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
                    secure=_secure(request, c), path="/login")
    return resp


@router.post("/login")
async def login(request: Request, c: ConsoleDep, token: Annotated[str, Form()], csrf: Annotated[str, Form()],
                next: Annotated[str, Form()] = "/") -> Response:
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if not nonce or not secrets.compare_digest(csrf, c.signer.login_csrf(nonce)):
        return page(request, "login.html", next=safe_next(next), login_csrf=csrf, status_code=400,
                    error="The login form expired; reload the page and try again.")
    given = token.strip()
    try:
        principal = c.access.identify(given) if given else None
    except Refused as exc:
        principal, why = None, str(exc)
    else:
        why = "Wrong token: it is nobody's (or not accepted by the console)."
    c.access.audit(principal, "POST", "/login", 303 if principal else 401)
    if principal is None:
        return page(request, "login.html", next=safe_next(next), login_csrf=csrf, status_code=401, error=why)
    ends = _expiry(given) if principal.via == "oidc" else None
    session, cookie = c.signer.new_session(c.settings.session_hours * 3600, ends=ends)
    c.sessions.add(session, Person(principal.name, principal.role, principal.via, given))
    resp = RedirectResponse(safe_next(next), status_code=303)
    resp.set_cookie(SESSION_COOKIE, cookie, max_age=int(c.settings.session_hours * 3600), httponly=True,
                    samesite="lax", secure=_secure(request, c))
    resp.delete_cookie(LOGIN_COOKIE, path="/login")
    return resp


def _expiry(token: str) -> float | None:
    """An OIDC token's `exp` (its signature was checked by `identify`): the session ends with it."""
    if not looks_like_jwt(token):
        return None
    exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    return float(exp) if isinstance(exp, (int, float)) else None


@router.post("/logout")
async def logout(c: ConsoleDep, sess: CsrfDep) -> Response:
    c.sessions.end(sess)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE)
    return resp
