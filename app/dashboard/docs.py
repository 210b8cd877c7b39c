"""The interactive API docs at ``/docs``: Swagger UI served from this process, under the
dashboard's Content-Security-Policy, so the page works with no internet access.

FastAPI's own ``/docs`` loads Swagger UI from a CDN and starts it with an inline script; a host
without internet showed a blank page, and no strict CSP could allow it. Here the assets come
from the ``fastapi-offline`` wheel (Swagger UI's bundle and stylesheet, kept current there) and
the page and its start-up script from ``fastapi-csp-docs`` (no inline script or style), so
``script-src 'self'`` holds. ReDoc is left off: it injects styles and starts a worker from a
``blob:`` URL at run time, which that policy forbids, and Swagger UI shows the same document.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_csp_docs
import fastapi_offline
from fastapi import APIRouter, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from app.dashboard.base import DashboardRoute

DOCS = "/docs"
ASSETS = f"{DOCS}/assets"
INITIALIZER = f"{DOCS}/swagger-initializer.js"
# The wheel's folder of vendored files (swagger-ui-bundle.js, swagger-ui.css, favicon.png).
ASSETS_DIRECTORY = Path(fastapi_offline.__file__).parent / "static"


def build_router(*, title: str, openapi_url: str) -> APIRouter:
    """``/docs``, its start-up script and its assets, none of them in the OpenAPI document."""
    router = APIRouter(route_class=DashboardRoute, include_in_schema=False)

    @router.get(DOCS)
    async def swagger_ui() -> Response:
        """The Swagger UI page; it loads only same-origin scripts and styles."""
        return fastapi_csp_docs.get_swagger_ui_html(
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            swagger_ui_init_script_url=INITIALIZER,
        )

    @router.get(INITIALIZER)
    async def swagger_ui_initializer() -> Response:
        """Starts Swagger UI on this service's OpenAPI document."""
        return fastapi_csp_docs.get_swagger_ui_init_js(openapi_url=openapi_url)

    router.routes.append(
        Mount(ASSETS, app=StaticFiles(directory=ASSETS_DIRECTORY), name="docs-assets")
    )
    return router
