"""The uvicorn server `linguafusion serve` runs: connection limits, the WebSocket frame limit, masked logs, drain.

- Connections: at most ``server.max_connections`` at once (more are answered 503 and closed at once); a request's
  head (request line and headers, at most ``server.max_header_bytes``) must arrive within ``server.header_timeout_s``
  of the connection, or of its first byte on a kept-alive connection, so an idle new socket or one that sends a
  header byte every few seconds is closed (uvicorn alone keeps both open forever). An idle kept-alive connection
  closes after KEEP_ALIVE_S (15 s), longer than clients keep one for reuse (httpx: 5 s).
- An answer sent before its request's body ended (a 413 from Content-Length) says ``Connection: close``; the rest
  of the body is then read and dropped for LINGER_S before the connection closes. Kept alive, the connection would
  go on with a FIN close behind: a client that sent its next request before seeing the FIN lost it.
- Shutdown: the streams drain first (``app.state.drain``); then uvicorn waits GRACEFUL_S for open requests, and a
  file request still running FILE_ANSWER_MARGIN_S before that is answered 503 ``draining`` (api/admission.py
  ``begin_drain``) instead of being cancelled into a bare 500.
- WebSocket messages: ``ws_max_size`` = ``server.max_ws_message_bytes``, so an oversized message is refused by the
  protocol layer (close 1009) before it is buffered. No permessage-deflate: uvicorn inflates a compressed message on
  the event loop as its bytes arrive, and 4 MiB of silence deflates to about 4 KB, so one read of 64 KB held a dozen
  4 MiB messages to inflate and queue; eight such streams stalled /healthz for 30 s (PCM audio barely compresses,
  and the events a client reads are small).
- Logs: every handler of uvicorn's and our loggers masks API keys, URL passwords and key-bearing query parameters
  (redact.py), so ``?api_key=`` never reaches the access log.
- SIGTERM / SIGINT: live streams drain first (queued captions logged and sent, clients told to reconnect).

What is left to a reverse proxy in front (TLS, per-IP limits, slow request bodies) is in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import uvicorn
from starlette.applications import Starlette

from .. import redact
from ..config import Settings
from .deps import app_state

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

log = logging.getLogger("lingua_fusion.api")
# an idle kept-alive connection is closed after this; longer than HTTP clients keep idle connections for reuse
# (httpx: 5 s), so a client never sends its next request on a connection the server is closing at that moment
# ("Server disconnected without sending a response": the request is lost, a POST is not retried)
KEEP_ALIVE_S = 15
LINGER_S = 2.0  # after answering a request whose body was refused part-way
GRACEFUL_S = 10  # uvicorn's wait for open requests at shutdown, after the streams' drain; then it cancels them
BEAT_TICKS = 10  # a heartbeat every this many of uvicorn's 0.1 s ticks
FILE_ANSWER_MARGIN_S = 2.0  # a file request still running this long before that gets 503 draining, not a 500


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
            if self._lingering:  # the rest of a refused body, or a request the answer said not to send here
                return
            if self._in_head and self._head_timer is None:  # a kept-alive connection's next request begins
                self._arm()
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
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # this request's cycle (none for an upgrade)
                _close_unread(cycle, self._linger)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing() or self._lingering:
                return
            if not self.pipeline:  # kept alive, idle until KEEP_ALIVE_S: the next head is timed from its first byte
                self._disarm()
                self._in_head, self._head_bytes = True, 0

        _lingering = False

        def _linger(self) -> None:
            """The rest of a refused body is not wanted: say we are done (FIN after the answer), read and drop
            what is in flight for LINGER_S, then close (closing at once would reset the connection and could
            destroy the answer before the client reads it)."""
            if self._lingering or self.transport.is_closing():
                return
            self._lingering = True
            self._disarm()
            self._in_head = False
            self.flow.resume_reading()  # paused when the unread body filled uvicorn's buffer
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


def _close_unread(cycle: RequestResponseCycle, linger: Callable[[], None]) -> None:
    """An answer that starts before its request's body has ended says ``Connection: close`` (uvicorn would keep
    the connection with the rest of the body unread, and the old linger closed it under a client's next request),
    and the close after it lingers instead of resetting the connection. ``cycle`` is uvicorn's
    RequestResponseCycle: its ``send`` (what the app calls) and ``transport.close`` (its close after an answer
    that says close) are wrapped for this request only."""
    send, transport = cycle.send, cycle.transport

    async def sending(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and cycle.more_body:
            cycle.keep_alive = False  # uvicorn adds Connection: close and closes after the answer
        await send(message)

    cycle.send = sending  # type: ignore[method-assign]  # this request's cycle only
    cycle.transport = _LingerOnClose(transport, lambda: bool(cycle.more_body), linger)


class _LingerOnClose(asyncio.Transport):
    """A request's view of its connection: ``close()`` while the request's body is still unread lingers."""

    def __init__(self, transport: asyncio.Transport, unread: Callable[[], bool], linger: Callable[[], None]) -> None:
        super().__init__()
        self._transport, self._unread, self._linger = transport, unread, linger

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._transport.get_extra_info(name, default)

    def close(self) -> None:
        if self._unread():
            self._linger()
        else:
            self._transport.close()


class Heartbeat(Protocol):
    """A ``serve --workers`` worker's sign of life to its supervisor (api/workers.py ``SharedBeat``)."""

    def beat(self) -> None: ...  # the loop ran just now (called on it about once a second while serving)

    def draining(self) -> None: ...  # from now on it drains and then ends: no more beats, and none are owed


def build_server(app: Starlette, settings: Settings, *, log_level: str = "info",
                 heartbeat: Heartbeat | None = None) -> uvicorn.Server:
    """The configured server for ``app`` (run it with ``.run()``), telling ``heartbeat`` that its loop runs."""
    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port, log_level=log_level,
                            http=guarded_http(settings), ws_max_size=settings.server.max_ws_message_bytes,
                            ws_per_message_deflate=False,
                            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACEFUL_S,
                            h11_max_incomplete_event_size=settings.server.max_header_bytes)
    install_logging(log_level)  # again: uvicorn's dictConfig has just replaced its handlers

    class DrainingServer(uvicorn.Server):
        """On SIGTERM / SIGINT: drain live streams (queued captions logged and sent, clients told to reconnect)
        before uvicorn closes the connections."""

        async def on_tick(self, counter: int) -> bool:
            if heartbeat is not None and counter % BEAT_TICKS == 0:  # uvicorn ticks every 0.1 s while it serves
                heartbeat.beat()
            return await super().on_tick(counter)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if heartbeat is not None:  # the drain below runs past the ticks: the supervisor must not take it for a hang
                heartbeat.draining()
            state = app_state(app)
            await state.drain(settings.server.drain_timeout_s)
            await state.rooms.drain()  # room listeners: told to listen again elsewhere (SSE would hold the shutdown)
            # file requests still running are answered 503 draining before uvicorn cuts them
            state.drain_files(GRACEFUL_S - FILE_ANSWER_MARGIN_S)
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
