"""The console's static files (its style sheet and scripts, the vendored libraries), read once, served from memory.

Pages link each as `/static/<path>?v=<its hash>` (`url`, the templates' `asset()`), and that answer may be kept
for a year: a browser fetches a file once per version, and a page load after the first asks for none. Without
the current `v` a file is served with `no-cache` and its ETag (revalidated each time, 304 when unchanged).
What the first paint needs is put in the page itself (`inline`): the style sheet on every page, the fleet
page's two scripts; htmx and its SSE extension are deferred, so no page waits for a file before it is drawn.

Why from memory: starlette's StaticFiles stats and reads every file in a worker thread, and on a busy 2-core
machine each hand-over to a thread and back waits for a core: the fleet page's five files took 0.2-0.7 s
to arrive at load 6-12, while the console's own work for them is about a millisecond each.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response
from markupsafe import Markup

FOREVER = "public, max-age=31536000, immutable"
TEXT = ("text/", "application/javascript", "application/json")


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    version: str  # the first 16 hex digits of the body's SHA-256 (also its ETag)


class Assets:
    def __init__(self, directory: Path):
        self.files: dict[str, Asset] = {}
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                body = path.read_bytes()
                kind = mimetypes.guess_type(path.name)[0] or "text/plain"
                if kind.startswith(TEXT):
                    kind += "; charset=utf-8"
                self.files[path.relative_to(directory).as_posix()] = Asset(
                    body, kind, hashlib.sha256(body).hexdigest()[:16])

    def url(self, path: str) -> str:
        """The link to a file, versioned by its content (KeyError for a file there is not: a template's typo)."""
        return f"/static/{path}?v={self.files[path].version}"

    def inline(self, path: str) -> Markup:
        """A file's text for a `<style>` or `<script>` element of the page itself: what the first paint needs
        comes with the page, not one round trip later (the templates' `inline()`)."""
        text = self.files[path].body.decode()
        if "</" in text:  # would end its element early
            raise ValueError(f"{path} cannot be inlined: it contains '</'")
        return Markup(text)  # noqa: S704 - the console's own file, checked above

    def response(self, path: str, request: Request) -> Response:
        asset = self.files.get(path)
        if asset is None:
            return PlainTextResponse("Not Found", status_code=404)
        etag = f'"{asset.version}"'
        headers = {"ETag": etag,
                   "Cache-Control": FOREVER if request.query_params.get("v") == asset.version else "no-cache"}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)
