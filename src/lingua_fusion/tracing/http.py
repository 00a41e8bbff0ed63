"""The HTTP request span: ``TraceRequests`` (plain ASGI middleware, installed only when tracing is on) opens one
span per request, continuing the client's trace when it sends a W3C ``traceparent`` header; a route that does
work reaches it with ``request_trace`` and hands it down (``FileTranslator.translate(trace=...)``).

The span holds the method, the route template, the path (never the query string: it may carry a key) and the
status; the route adds ``key_id``. Health checks and metric scrapes are not traced.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ..asgi import StatusOf
from .core import Tracer, TraceRef

if TYPE_CHECKING:
    from fastapi import FastAPI

STATE_KEY = "lingua_fusion.trace"
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})


class TraceRequests:
    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        ref = self.tracer.root(f"{method} {scope['path']}", headers, **{"http.request.method": method,
                                                                      "url.path": scope["path"]})
        scope.setdefault("state", {})[STATE_KEY] = ref
        sent = StatusOf(send)
        try:
            await self.app(scope, receive, sent)
        except BaseException as exc:
            ref.fail(exc)
            raise
        finally:
            matched = scope.get("route")  # the route that took the request (no route: None)
            route = matched.path if isinstance(matched, (Route, WebSocketRoute, Mount)) else None
            if route is not None:
                ref.span.update_name(f"{method} {route}")
            if sent.status >= 500:
                ref.span.set_status(self.tracer.status_error, f"HTTP {sent.status}")
            ref.end(**{"http.route": route, "http.response.status_code": sent.status})


def request_trace(request: Request, **attrs: object) -> TraceRef | None:
    """This request's span (None with tracing off), with ``attrs`` added (``key_id``: never the key itself)."""
    ref: TraceRef | None = request.scope.get("state", {}).get(STATE_KEY)
    if ref is not None and attrs:
        ref.set(**attrs)
    return ref


def install(app: FastAPI, tracer: Tracer | None) -> None:
    """Wire ``tracer`` (None: tracing off, nothing installed) into a built app: the request span around every
    request (outermost, so refusals are traced too), a span per live stream (the StreamService and the per-stream
    baseline beside it), ``app.state.tracer`` for the lifespan to flush and shut down."""
    app.state.tracer = tracer
    if tracer is None:
        return
    app.add_middleware(TraceRequests, tracer=tracer)
    app.state.stream_front.trace(tracer)


async def shutdown(app: FastAPI) -> None:
    """Flush the spans still queued (bounded by the exporter's timeout), off the event loop."""
    tracer: Tracer | None = app.state.tracer  # set by install, on every app it was given (None: tracing off)
    if tracer is not None:
        await asyncio.to_thread(tracer.shutdown)
