"""The interactive API docs, offline: /docs serves Swagger UI from the swagger-ui-bundle-v2 wheel (no CDN), and
the OpenAPI document declares bearer auth so that its Authorize button takes an ``sk_...`` key for "Try it out".

FastAPI's own /docs and /redoc pages load their scripts from a CDN; they are replaced (ReDoc is dropped: no wheel
ships it). The page is FastAPI's Swagger HTML, built once: its one inline script (the ``SwaggerUIBundle`` call) is
allowed by its sha256 in the page's Content-Security-Policy (api/headers.py), computed from that exact text, so
no other inline script runs there. ``validatorUrl: null``: no badge fetched from validator.swagger.io.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from ..json_types import JSONObject
from .deps import route_path
from .headers import CSP, page_policy, script_hashes

ASSETS = "/docs/assets"
# routes anyone may call; every other operation needs "Authorization: Bearer sk_..." (/metrics: an admin key or
# the server's metrics token, api/deps.py check_scrape)
OPEN = {"/healthz", "/readyz", "/v1/models"}
SCHEME: JSONObject = {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "sk_...",
                         "description": "An API key from `linguafusion keys create` (Authorization: Bearer sk_...)"}}


def install(app: FastAPI) -> None:
    from swagger_ui_bundle import swagger_ui_path

    app.router.routes[:] = [r for r in app.router.routes
                            if route_path(r) not in {app.docs_url, app.redoc_url,
                                                                app.swagger_ui_oauth2_redirect_url}]
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    page = get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title="LinguaFusion API",
                               swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
                               swagger_ui_parameters={"persistAuthorization": True, "validatorUrl": None})
    html = bytes(page.body).decode()
    policy = page_policy(script_hashes(html))

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(html, headers={CSP: policy})

    app.openapi = _with_bearer(app, app.openapi)  # type: ignore[method-assign]


def _with_bearer(app: FastAPI, build: Callable[[], JSONObject]) -> Callable[[], JSONObject]:
    def openapi() -> JSONObject:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()  # FastAPI's document: each level below is an object
        components = schema.setdefault("components", {})
        assert isinstance(components, dict)
        schemes = components.setdefault("securitySchemes", {})
        assert isinstance(schemes, dict)
        schemes.update(SCHEME)
        schema["security"] = [{"bearerAuth": []}]
        paths = schema.get("paths", {})
        assert isinstance(paths, dict)
        for path, operations in paths.items():
            if path in OPEN:
                assert isinstance(operations, dict)
                for op in operations.values():
                    assert isinstance(op, dict)
                    op["security"] = []
        app.openapi_schema = schema
        return schema

    return openapi
