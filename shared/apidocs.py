"""Swagger UI and ReDoc from vendored files, so every service's /docs and /redoc work air-gapped.

FastAPI's defaults load both from a CDN; a GPU cluster often has no internet.
The assets (versions and licences in `static/apidocs/VENDORED.md`) ship in the package.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(__file__).parent / "static" / "apidocs"
MOUNT = "/_apidocs"
# The browser itself refuses anything from another host: ReDoc 2.5's sidebar always shows Redocly's logo
# from cdn.redoc.ly (it hides the image when that fails), and neither page needs any other host.
LOCAL_ONLY = {"Content-Security-Policy": "default-src 'self' 'unsafe-inline' 'unsafe-eval' data: blob:"}


def mount_api_docs(app: FastAPI) -> None:
    """Serve `/docs` and `/redoc` for `app` (created with docs_url=None, redoc_url=None) from the vendored assets."""
    app.mount(MOUNT, StaticFiles(directory=ASSETS), name="apidocs")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _local_only(get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{title} - API",
            swagger_js_url=f"{MOUNT}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{MOUNT}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{MOUNT}/swagger-ui/favicon-32x32.png",
        ))

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _local_only(get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{title} - ReDoc",
            redoc_js_url=f"{MOUNT}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{MOUNT}/swagger-ui/favicon-32x32.png", with_google_fonts=False,
        ))


def _local_only(response: HTMLResponse) -> HTMLResponse:
    response.headers.update(LOCAL_ONLY)
    return response
