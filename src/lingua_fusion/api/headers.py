"""Security headers on every HTTP response (issue 29): the browser pages cannot be framed, run only the scripts
this server ships, and no response is sniffed into something it does not say it is.

- every response: ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer``
  and a ``Content-Security-Policy``;
- an HTML response: ``PAGE_POLICY`` (scripts, styles, fetches and sockets from this origin only; no inline script,
  no framing), unless its route set a policy of its own (/docs: ``page_policy`` with the sha256 of its one inline
  script, api/docs.py);
- any other response (JSON, Prometheus text, the pages' scripts and styles): ``API_POLICY``, which lets nothing
  load or run should a browser ever render one as a document.

``SecurityHeaders`` wraps the whole application, outside Starlette's error middleware (``install``), so that a 500,
a 413 from the body guard or a 404 carries them too. Responses uvicorn writes itself (a malformed request line, the
connection cap's 503 in api/server.py) do not pass through the app and have none.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# 'self' covers ws:// and wss:// on this host (CSP level 3) for the pages' WebSockets; media-src blob: is the
# captions page playing a chosen file; img-src data: is the pages' empty favicon and Swagger UI's inline SVGs
_PAGE = ("default-src 'self'", "script-src 'self'{hashes}", "style-src 'self'", "img-src 'self' data:",
         "media-src 'self' blob:", "connect-src 'self'", "object-src 'none'", "base-uri 'none'",
         "form-action 'self'", "frame-ancestors 'none'")
API_POLICY = "default-src 'none'; frame-ancestors 'none'"
ALWAYS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY", "referrer-policy": "no-referrer"}
CSP = "content-security-policy"
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)


def page_policy(script_hashes: Iterable[str] = ()) -> str:
    """The pages' policy; ``script_hashes`` (``'sha256-...'`` sources) allow those exact inline scripts."""
    hashes = "".join(f" {h}" for h in script_hashes)
    return "; ".join(_PAGE).format(hashes=hashes)


PAGE_POLICY = page_policy()


def script_hashes(html: str) -> list[str]:
    """The CSP source (``'sha256-<base64>'``) of each inline ``<script>`` of ``html``, over its exact text: what a
    browser hashes, so a change of one byte in the script needs a new hash (compute it from the served text)."""
    return [f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
            for body in _INLINE_SCRIPT.findall(html)]


class SecurityHeaders:
    """Plain ASGI: adds ``ALWAYS`` and a policy to each response start, keeping any the route set itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in ALWAYS.items():
                    headers.setdefault(name, value)
                html = headers.get("content-type", "").startswith("text/html")
                headers.setdefault(CSP, PAGE_POLICY if html else API_POLICY)
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI) -> None:
    """Wrap ``app``'s whole middleware stack (built at its first request) in ``SecurityHeaders``: outside
    ``ServerErrorMiddleware``, which answers a route's unexpected exception after every user middleware is left."""
    build = app.build_middleware_stack

    def wrapped() -> ASGIApp:
        return SecurityHeaders(build())

    app.build_middleware_stack = wrapped  # type: ignore[method-assign]
