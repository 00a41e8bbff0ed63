"""The outermost ASGI middleware: checks that need no route, on every HTTP request and WebSocket handshake.

- Host allow-list: a ``Host`` not on it gets 400 ``host_not_allowed`` (DNS rebinding: a page on evil.example whose
  name now resolves to 127.0.0.1 sends ``Host: evil.example``).
- Origin allow-list: a browser request (it carries ``Origin``) from an origin not on it gets 403
  ``origin_not_allowed``; a WebSocket handshake from one is refused with 403 before it is accepted. Clients that
  are not browsers send no Origin and are not concerned.
- Body size, counted as the bytes arrive, whatever Content-Length or Transfer-Encoding say: past the route's limit
  the request ends with 413 ``too_large`` (a chunked upload no longer reaches a temporary file whole). The rest
  of the body is then read and dropped, up to 16 MiB and 5 s, so a client still sending reads the 413 instead of
  a broken connection.

Defaults (``server.allowed_hosts`` / ``server.allowed_origins`` left unset): with auth on, any host and origin (a
page without a key can do nothing); with ``--no-auth``, the loopback names only and the server's own origin only.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import Settings
from ..errors import HostNotAllowed, LinguaFusionError, OriginNotAllowed, TooLarge
from .deps import app_state
from .errors import error_response

LOOPBACK = ("localhost", "127.0.0.1", "::1")
FORM_OVERHEAD = 64 * 1024  # multipart boundaries, part headers and the small fields next to a file


class Policy:
    """Which hosts and origins a server answers (pure; built once from the settings)."""

    def __init__(self, settings: Settings) -> None:
        server = settings.server
        hosts = server.allowed_hosts
        if hosts is None:
            hosts = ["*"] if server.auth else [*LOOPBACK, server.host]
        self.hosts = {h.lower().rstrip(".").strip("[]") for h in hosts}
        origins = server.allowed_origins
        if origins is None:
            origins = ["*"] if server.auth else []  # []: same origin only
        self.origins = {o.lower().rstrip("/") for o in origins}

    def check_host(self, host_header: str | None) -> None:
        if "*" in self.hosts:
            return
        name = _hostname(host_header or "")
        if name in self.hosts or any(h.startswith("*.") and name.endswith(h[1:]) for h in self.hosts):
            return
        raise HostNotAllowed(f"this server does not answer for the host {name!r}; set server.allowed_hosts",
                             details={"allowed_hosts": sorted(self.hosts)})

    def check_origin(self, origin: str | None, host_header: str | None, scheme: str = "http") -> None:
        if origin is None or "*" in self.origins:
            return
        origin = origin.lower().rstrip("/")
        if origin in self.origins or _same_origin(origin, host_header or "", scheme):
            return
        raise OriginNotAllowed(f"requests from pages at {origin} are not allowed here; set server.allowed_origins")


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")


def _same_origin(origin: str, host_header: str, scheme: str) -> bool:
    """``origin`` is this server as the request reached it (scheme and Host)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != {"ws": "http", "wss": "https"}.get(scheme, scheme) or parts.hostname is None:
        return False
    default = 443 if parts.scheme == "https" else 80
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = name if port in (None, default) else f"{name}:{port}"
    want = host_header.strip().lower()
    return netloc == want or netloc == want.removesuffix(f":{default}")


def body_limit(settings: Settings, method: str, path: str) -> int:
    """The most bytes a request body may have on this route."""
    limits = settings.limits
    if method == "POST" and path in ("/v1/translate", "/v1/audio/transcriptions", "/v1/audio/translations"):
        return limits.max_upload_bytes + FORM_OVERHEAD + 4 * limits.max_text_chars
    if method == "POST" and path == "/v1/glossaries":
        return min(limits.max_upload_bytes, limits.max_glossary_bytes) + FORM_OVERHEAD
    if method == "POST" and path.startswith("/v1/vocabularies/"):  # landmark JSON, imports, example videos
        return min(limits.max_upload_bytes, settings.vision.max_vocabulary_bytes) + FORM_OVERHEAD
    return limits.max_json_bytes


class Guard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.policy = Policy(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        counted: _Counted | None = None
        try:
            self.policy.check_host(headers.get("host"))
            self.policy.check_origin(headers.get("origin"), headers.get("host"), scope.get("scheme", "http"))
            if scope["type"] == "http":
                limit = body_limit(self.settings, scope["method"], scope["path"])
                _check_length(headers.get("content-length"), limit)
                counted = _Counted(receive, limit)
        except LinguaFusionError as exc:
            _count(scope, exc)
            if scope["type"] == "websocket":
                await _refuse_handshake(scope, send, exc)
                return
            whole = isinstance(exc, TooLarge) and await _drain(receive)
            response = error_response(exc)
            if not whole:
                response.headers["connection"] = "close"  # the body was not read: this connection cannot go on
            await response(scope, receive, send)
            return
        if counted is None:
            await self.app(scope, receive, send)
            return
        await self.app(scope, counted, _closing_if(counted, send))


DRAIN_BYTES = 16 * 1024 * 1024  # before a 413 is sent, the rest of the body up to this much is read and dropped ...
DRAIN_S = 5.0  # ... for at most this long, so that a client still sending reads the answer


async def _drain(receive: Receive) -> bool:
    """Read and drop what is left of a refused request's body, bounded in bytes and time; True when it all came.

    The server (uvicorn) stops delivering the body once a response is complete, and a connection closed while the
    client is still sending makes many clients report a broken connection instead of the 413 they were sent; so
    the rest is read first. Past the bounds the answer says ``Connection: close``."""
    seen = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_S):
            while seen <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return False
                seen += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    return False


def _closing_if(counted: _Counted, send: Send) -> Send:
    """``send`` that marks the response ``Connection: close`` when the body was cut short and not drained."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and counted.over and not counted.whole:
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return sending


def _check_length(value: str | None, limit: int) -> None:
    if value is not None and value.strip().isdigit() and int(value) > limit:
        raise TooLarge(f"request body is {int(value)} bytes; this route takes at most {limit}",
                       details={"limit_bytes": limit})


class _Counted:
    """``receive`` that counts body bytes and raises TooLarge (413, through the app's error map) past ``limit``,
    once it has drained what is left of the body (bounded)."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive, self.limit = receive, limit
        self.seen = 0
        self.over = False
        self.whole = False  # the rest of the body was drained

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit:
                self.over = True
                self.whole = not message.get("more_body", False) or await _drain(self.receive)
                raise TooLarge(f"request body is over {self.limit} bytes, the limit of this route",
                               details={"limit_bytes": self.limit})
        return message


async def _refuse_handshake(scope: Scope, send: Send, exc: LinguaFusionError) -> None:
    """Refuse a WebSocket before accepting it: an HTTP error response with the JSON body where the server supports
    it (ASGI websocket.http.response), a bare 403 otherwise."""
    if "websocket.http.response" in scope.get("extensions", {}):
        response = error_response(exc)
        await send({"type": "websocket.http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "websocket.http.response.body", "body": response.body})
    else:
        await send({"type": "websocket.close", "code": 4000 + exc.status})


def _count(scope: Scope, exc: LinguaFusionError) -> None:
    app_state(scope["app"]).metrics.errors.labels(code=exc.code).inc()

