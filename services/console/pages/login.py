"""Login with the admin token (until roles land), and logout."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..auth import LOGIN_COOKIE, SESSION_COOKIE, safe_next
from ..web import ConsoleDep, CsrfDep, page

router = APIRouter()


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, c: ConsoleDep, next: str = "/") -> Response:
    nonce = secrets.token_urlsafe(16)
    resp = page(request, "login.html", next=safe_next(next), login_csrf=c.signer.login_csrf(nonce), error=None)
    resp.set_cookie(LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
                    secure=c.settings.cookie_secure, path="/login")
    return resp


@router.post("/login")
async def login(request: Request, c: ConsoleDep, token: Annotated[str, Form()], csrf: Annotated[str, Form()],
                next: Annotated[str, Form()] = "/") -> Response:
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    if not nonce or not secrets.compare_digest(csrf, c.signer.login_csrf(nonce)):
        return page(request, "login.html", next=safe_next(next), login_csrf=csrf, status_code=400,
                    error="The login form expired; reload the page and try again.")
    if not c.signer.token_matches(token.strip()):
        return page(request, "login.html", next=safe_next(next), login_csrf=csrf, status_code=401,
                    error="Wrong token. It is `admin_token` in ~/.whaleflux/config.json for `whaleflux up`.")
    _, cookie = c.signer.new_session(c.settings.session_hours * 3600)
    resp = RedirectResponse(safe_next(next), status_code=303)
    resp.set_cookie(SESSION_COOKIE, cookie, max_age=int(c.settings.session_hours * 3600), httponly=True,
                    samesite="lax", secure=c.settings.cookie_secure)
    resp.delete_cookie(LOGIN_COOKIE, path="/login")
    return resp


@router.post("/logout")
async def logout(_: CsrfDep) -> Response:
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE)
    return resp
