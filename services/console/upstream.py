"""The console's one HTTP client to the other services (reads need a viewer in production, writes their role;
docs/security.md). A request made while serving a person (`acting_as`, set from their session) carries that
person's own credential, so the services apply that person's role and their audit log names them; only the
console's own background reads (the live views shared by every browser, the fleet's node states) carry the
console's reader token, a viewer's (`ConsoleSettings.reader_token`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

T = TypeVar("T")
# The credential of the person this request is served for (web.session sets it); None: the console's own work.
acting_as: ContextVar[str | None] = ContextVar("acting_as", default=None)


@contextlib.contextmanager
def as_console() -> Iterator[None]:
    """Calls made inside carry the console's own token: for what is read once and shown to everyone."""
    reset = acting_as.set(None)
    try:
        yield
    finally:
        acting_as.reset(reset)


class UpstreamError(Exception):
    """A service did not answer, or refused: `detail` is the service's own words, for the page."""

    def __init__(self, service: str, detail: str, status: int | None = None):
        super().__init__(f"{service}: {detail}")
        self.service, self.detail, self.status = service, detail, status


class Upstream:
    def __init__(self, urls: dict[str, str], reader_token: str, timeout_s: float = 5.0):
        self.urls = urls
        self._token = reader_token
        self.http = httpx.AsyncClient(timeout=timeout_s)

    async def close(self) -> None:
        await self.http.aclose()

    async def get(self, service: str, path: str, /, **params: Any) -> Any:
        return await self._send("GET", service, path, params={k: v for k, v in params.items() if v not in (None, "")})

    async def get_as(self, model: type[T], service: str, path: str, /, **params: Any) -> T:
        """GET and read the body as `model` (a pydantic model or a type such as list[Model]). A body that does not
        fit the model is the service's error, shown on the page (the field named), never the console's bare 500."""
        body = await self.get(service, path, **params)
        try:
            return TypeAdapter(model).validate_python(body)
        except ValidationError as exc:
            raise UpstreamError(service, f"answered {path} in a shape the console cannot read: {_fields(exc)}",
                                502) from None

    async def raw(self, service: str, path: str, /, **params: Any) -> httpx.Response:
        """GET the response itself (exports: CSV bodies, their headers)."""
        given = {k: v for k, v in params.items() if v not in (None, "")}
        return await self._request("GET", service, path, params=given)

    async def post(self, service: str, path: str, body: dict | BaseModel) -> Any:
        payload = body.model_dump(mode="json", exclude_none=True) if isinstance(body, BaseModel) else body
        return await self._send("POST", service, path, json=payload)

    async def _send(self, method: str, service: str, path: str, **kw: Any) -> Any:
        resp = await self._request(method, service, path, **kw)
        return resp.json()

    async def _request(self, method: str, service: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {acting_as.get() or self._token}"}
        try:
            resp = await self.http.request(method, self.urls[service] + path, headers=headers, **kw)
        except httpx.HTTPError as exc:
            raise UpstreamError(service, f"unreachable at {self.urls[service]} ({type(exc).__name__})") from None
        if resp.status_code >= 400:
            raise UpstreamError(service, _detail(resp), resp.status_code)
        return resp


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    if isinstance(detail, list):  # FastAPI's 422: one line per field
        detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    return f"{resp.status_code}: {str(detail)[:500]}"


def _fields(exc: ValidationError, most: int = 3) -> str:
    errors = exc.errors()
    lines = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:most]]
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(lines) + more


async def fetch_all(calls: dict[str, Awaitable[Any]]) -> tuple[dict[str, Any], list[str]]:
    """Run the calls at once; a service that fails leaves its value None and one line in the errors,
    so a page shows what the others answered."""
    names = list(calls)
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    values: dict[str, Any] = {}
    errors: list[str] = []
    for name, result in zip(names, results, strict=True):
        if isinstance(result, UpstreamError):
            values[name] = None
            errors.append(str(result))
        elif isinstance(result, BaseException):
            raise result
        else:
            values[name] = result
    return values, list(dict.fromkeys(errors))
