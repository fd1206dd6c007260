"""The API's documentation pages, served without any other host: /docs (Swagger UI) and /redoc.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, so on an air-gapped cluster /docs
is a blank page. Here both pages are FastAPI's own (``get_swagger_ui_html``, ``get_redoc_html``)
pointed at assets served by this process from ``/docs-assets``: Swagger UI 5 (Apache-2.0) and
ReDoc 2 (MIT) as shipped, with their licence headers, in the pinned ``fastapi-offline`` wheel
(MIT; its ``static/`` folder — we use the files, not its app factory). Google Fonts are off, and
Swagger UI's online validator badge (an image from validator.swagger.io) is off.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: where the Swagger UI / ReDoc assets are served
ASSETS_URL = "/docs-assets"
#: Swagger UI options on top of FastAPI's defaults: no online validator badge (an external image)
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}


def assets_dir() -> Path:
    """The folder holding swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png."""
    return Path(str(files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Add /docs, /docs/oauth2-redirect and /redoc (local assets) to an app created with
    ``docs_url=None, redoc_url=None``. The pages are open like FastAPI's (no token): they hold no
    data; the OpenAPI document they read is ``app.openapi_url``."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect}",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS)

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False)
