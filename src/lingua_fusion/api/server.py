"""The uvicorn server `linguafusion serve` runs: connection limits, the WebSocket frame limit, masked logs, drain.

- Connections: at most ``server.max_connections`` at once (more are answered 503 and closed at once); a request's
  head (request line and headers, at most ``server.max_header_bytes``) must arrive within ``server.header_timeout_s``
  of the connection or of the previous response, so an idle socket or one that sends a header byte every few
  seconds is closed (uvicorn alone keeps both open forever). Idle keep-alive connections close after 5 s (uvicorn).
- WebSocket messages: ``ws_max_size`` = ``server.max_ws_message_bytes``, so an oversized message is refused by the
  protocol layer (close 1009) before it is buffered.
- Logs: every handler of uvicorn's and our loggers masks API keys, URL passwords and key-bearing query parameters
  (redact.py), so ``?api_key=`` never reaches the access log.
- SIGTERM / SIGINT: live streams drain first (queued captions logged and sent, clients told to reconnect).

What is left to a reverse proxy in front (TLS, per-IP limits, slow request bodies) is in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import uvicorn

from .. import redact
from ..config import Settings

log = logging.getLogger("lingua_fusion.api")
KEEP_ALIVE_S = 5
LINGER_S = 2.0  # after answering a request whose body was refused part-way


def guarded_http(settings: Settings) -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol with a connection cap, a head timeout and a head size limit."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's h11 (head size limited by h11_max_incomplete_event_size only)
        log.warning("httptools is not installed: no header timeout or connection cap (put a proxy in front)")
        return "h11"
    server = settings.server
    timeout_s, max_head, max_conns = server.header_timeout_s, server.max_header_bytes, server.max_connections

    class GuardedHttpTools(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _in_head = True
        _head_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_conns:
                self._refuse(503, "overloaded", "the server has too many open connections; retry later")
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            in_head = self._in_head
            super().data_received(data)
            if in_head and self._in_head and not self.transport.is_closing():  # still no complete head
                self._head_bytes += len(data)
                if self._head_bytes > max_head:
                    self._refuse(431, "too_large", f"the request head is over {max_head} bytes")

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_head = False
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            unfinished = self.cycle is not None and self.cycle.more_body  # answered before the body ended (413)
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if unfinished:
                self._linger()
            elif not self.pipeline:  # keep-alive: the next request's head is timed too
                self._in_head, self._head_bytes = True, 0
                self._arm()

        def _linger(self) -> None:
            """The rest of a refused body is not wanted: say we are done (FIN after the answer), read and drop
            what is in flight for LINGER_S, then close (closing at once would reset the connection and could
            destroy the answer before the client reads it)."""
            self._disarm()
            self._in_head = False
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                self.transport.close()  # nothing useful was sent: no answer, no log line

        def _refuse(self, status: int, code: str, message: str) -> None:
            self._disarm()
            body = json.dumps({"error": {"code": code, "message": message}}).encode()
            phrase = {431: "Request Header Fields Too Large", 503: "Service Unavailable"}[status]
            self.transport.write(f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
                                 f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
            self.transport.close()

    return GuardedHttpTools


def build_server(app: Any, settings: Settings, *, log_level: str = "info") -> uvicorn.Server:
    """The configured server for ``app`` (run it with ``.run()``)."""
    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port, log_level=log_level,
                            http=guarded_http(settings), ws_max_size=settings.server.max_ws_message_bytes,
                            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=10,
                            h11_max_incomplete_event_size=settings.server.max_header_bytes)
    install_logging(log_level)  # again: uvicorn's dictConfig has just replaced its handlers

    class DrainingServer(uvicorn.Server):
        """On SIGTERM / SIGINT: drain live streams (queued captions logged and sent, clients told to reconnect)
        before uvicorn closes the connections."""

        async def shutdown(self, sockets: Any = None) -> None:
            await app.state.drain(settings.server.drain_timeout_s)
            await super().shutdown(sockets)

    return DrainingServer(config)


def install_logging(log_level: str) -> None:
    """Our records through a handler of their own (uvicorn's format), every handler masking secrets."""
    ours = logging.getLogger("lingua_fusion")
    if not ours.handlers:
        from uvicorn.logging import DefaultFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(name)s: %(message)s"))
        ours.addHandler(handler)
    ours.setLevel(log_level.upper())
    redact.install("uvicorn", "uvicorn.error", "uvicorn.access", "lingua_fusion")
