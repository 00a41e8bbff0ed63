"""WebSocket live streams: ``WS /v1/streams``. Protocol in docs/streaming.md, close codes in stream/protocol.py.

The route only moves bytes: check the key -> read the start message -> StreamService.open -> a reader task feeding
the session and a writer sending its events. Opening, resuming, quotas, admission and replay are the service's.

The key is checked at the handshake, before any message is read: from ``Authorization: Bearer``, or (browsers, which
cannot set headers on a WebSocket) from the subprotocol list ``["linguafusion", "bearer.<key>"]``, which keeps the
key out of URLs and access logs; or a single-use ``?ticket=`` from ``POST /v1/stream-tickets`` (api/tickets.py);
``?api_key=`` still works and is masked in the logs (redact.py). Messages over
``server.max_ws_message_bytes`` are refused by the WebSocket layer itself (close 1009) before they are buffered; a
text message is measured before it is parsed (``limits.max_json_depth`` / ``max_json_elements``: 4413 too_large),
on a worker thread when it is over ``OFF_LOOP_CHARS``.
Whatever a client sends ends in an error event and/or a close code, never in an unhandled exception.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from .. import strict_json
from ..config import Settings
from ..errors import ClientError, InvalidParameter, LinguaFusionError, Overloaded, TooLarge
from ..json_bounds import JsonBounds, bounds_of
from ..json_types import JSONObject, JSONValue
from ..stream.events import Event, error_event
from ..stream.front import StreamFront
from ..stream.protocol import MAX_START_BYTES, close_code
from ..stream.service import Principal
from ..stream.session import StreamSession
from .handshake import offered_secret
from .tickets import is_ticket

log = logging.getLogger("lingua_fusion.api")
SUBPROTOCOL = "linguafusion"  # offered with "bearer.<key>"; the server answers with this one, never the key
BEARER = "bearer."
OFF_LOOP_CHARS = 64 * 1024  # a longer text message is measured and parsed on a worker thread
REFUSE_WAIT_S = 2.0  # a refused client's first message is awaited this long (and dropped) before the close


def install(app: FastAPI, front: StreamFront, authenticate: Callable[[str | None], Awaitable[Principal]]) -> None:
    settings = front.batched.settings

    @app.websocket("/v1/streams")
    async def streams(ws: WebSocket) -> None:
        secret, subprotocol = _credentials(ws)
        await ws.accept(subprotocol=subprotocol)
        session: StreamSession | None = None
        try:
            try:
                who = await authenticate(secret)  # before reading anything: nothing keyless is kept
            except LinguaFusionError as exc:
                await _refuse_unread(ws, exc)
                return
            msg = await _start(ws, settings)
            opened = await front.open(msg, who)
            session = opened.session
            for event in opened.greeting:
                await _send(ws, event)
            if opened.finished:
                await ws.close(code=1000)
                return
            writer = asyncio.create_task(_write(ws, session), name="ws-writer")
            try:
                await _read(ws, session, settings)
                await writer
            finally:  # the writer is awaited on every path: one that ended on the client's disconnect while
                # the reader failed too would otherwise be a task whose exception nobody retrieved
                if not writer.done():
                    writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer
        except LinguaFusionError as exc:
            with contextlib.suppress(Exception):
                await _send(ws, error_event(exc))
                await ws.close(code=close_code(exc), reason=exc.code)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await ws.send_json({"type": "error", "code": "idle_timeout", "message": "no message in time"})
                await ws.close(code=4408, reason="idle_timeout")
        except WebSocketDisconnect:
            pass
        except Exception:  # a bug, not the client's doing: logged; the client still gets a code
            log.exception("stream failed")
            with contextlib.suppress(Exception):
                await ws.send_json({"type": "error", "code": "internal", "message": "internal error; see the "
                                    "server log"})
                await ws.close(code=1011, reason="internal")
        finally:
            if session is not None:
                session.abort()


async def _refuse_unread(ws: WebSocket, exc: LinguaFusionError) -> None:
    """Refuse a client before its first message: the error event now, the close once its first message has
    arrived (dropped unread; the frame limit bounds it) or REFUSE_WAIT_S have passed. Closing at once would race
    with the client's own first send, which would then fail without the client ever reading why."""
    with contextlib.suppress(Exception):
        await _send(ws, error_event(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ws.receive(), REFUSE_WAIT_S)
        await ws.close(code=close_code(exc), reason=exc.code)


def _credentials(ws: WebSocket) -> tuple[str | None, str | None]:
    """(the key, the subprotocol to answer with): Authorization header, else a ``bearer.<key>`` subprotocol, else
    a single-use ``?ticket=`` (api/tickets.py: what the web page uses; a key there is not taken), else
    ``?api_key=`` (kept for old clients; masked in the logs)."""
    secret, chosen = offered_secret(ws, answers=(SUBPROTOCOL,), prefix=BEARER)
    if secret is not None:
        return secret, chosen
    ticket = ws.query_params.get("ticket")
    if ticket is not None:
        return (ticket if is_ticket(ticket) else None), chosen
    return ws.query_params.get("api_key"), chosen


async def _start(ws: WebSocket, settings: Settings) -> JSONObject:
    first = await asyncio.wait_for(ws.receive(), timeout=settings.server.stream_idle_timeout_s)
    if first["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(first.get("code", 1000))
    raw = first.get("text")
    if raw is None:
        raise InvalidParameter("the first message must be the JSON start message, not binary data")
    if len(raw) > MAX_START_BYTES:
        raise TooLarge("start message too large")
    msg = _json(raw, "the start message must be JSON", bounds_of(settings))
    if not isinstance(msg, dict):
        raise InvalidParameter("the start message must be a JSON object")
    return msg


def _json(raw: str, message: str, bounds: JsonBounds) -> JSONValue:
    try:  # NaN / Infinity and lone surrogates: refused like any other malformed text (strict_json.py)
        return strict_json.loads(raw, bounds)  # too deep, too many elements: TooLarge before parsing
    except (ValueError, RecursionError) as exc:
        raise InvalidParameter(message) from exc


async def parse_message(raw: str, message: str, bounds: JsonBounds) -> JSONValue:
    """``_json``, on a worker thread for a long message: the measuring is numpy (it lets the loop run) and what
    is then parsed is bounded in elements."""
    if len(raw) <= OFF_LOOP_CHARS:
        return _json(raw, message, bounds)
    return await asyncio.to_thread(_json, raw, message, bounds)


async def _send(ws: WebSocket, event: Event) -> None:
    await ws.send_json(event.to_wire())


class _Rate:
    """A token bucket: ``rate`` messages per second on average, bursts up to two seconds' worth."""

    def __init__(self, rate: float) -> None:
        self.rate, self.capacity = rate, 2 * rate
        self.tokens = self.capacity
        self.t = time.monotonic()

    async def pace(self) -> None:
        """Take a token, waiting for one when the bucket is empty (at most one token's time, 1 / rate): while
        this reader waits, the socket's buffers fill and TCP slows the client down (OpenAI Realtime clients send
        as fast as their loop goes and are not told of a limit)."""
        if self.take():
            return
        await asyncio.sleep((1 - self.tokens) / self.rate)  # the time one token takes to come back
        if not self.take():  # a rounding error short of a token: taken all the same
            self.tokens = 0.0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


async def _read(ws: WebSocket, session: StreamSession, settings: Settings) -> None:
    idle, max_bytes = settings.server.stream_idle_timeout_s, settings.server.max_ws_message_bytes
    rate = _Rate(settings.server.max_ws_messages_per_s)
    bounds = bounds_of(settings)
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=idle)
        if not rate.take():
            raise Overloaded(f"more than {rate.rate:g} messages per second on this stream", retry_after=1.0)
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        if session.closed.is_set():
            return  # the session ended itself (slow consumer, shed, drain): the writer says why and closes
        data = msg.get("bytes")
        text = msg.get("text") or ""
        if len(data if data is not None else text) > max_bytes:
            raise TooLarge(f"message over {max_bytes} bytes")
        m = None if data is not None else await _message(text, bounds)  # malformed: the stream ends (4400)
        if m is not None and m.get("type") == "end":
            await session.end()
            return
        try:
            if data is not None:
                await session.feed_audio(data)
            elif m is not None:  # (always, for a text message)
                await _feed(session, m)
        except (ClientError, Overloaded) as exc:  # one bad message or one image too many: say so, keep the stream
            if isinstance(exc, TooLarge):
                raise
            if session.closed.is_set():
                return
            # never blocks: a client that sends bad messages and reads nothing is closed as a slow consumer
            session.notify(error_event(exc))


async def _message(text: str, bounds: JsonBounds) -> JSONObject:
    m = await parse_message(text, "messages must be JSON objects or binary PCM16 audio", bounds)
    if not isinstance(m, dict):
        m = {"type": None}  # an unknown message: an error event, the stream goes on
    return m  # its ts is checked by the session (stream/protocol.py check_ts), for in-process streams too


async def _feed(session: StreamSession, m: JSONObject) -> None:
    # the session checks ts (stream/protocol.py check_ts: a JSON value that is not a number is an invalid_parameter
    # error event there, after the stream's own checks)
    kind, ts = m.get("type"), m.get("ts")
    if kind == "audio":
        await session.feed_audio(_b64(m.get("data")), ts)
    elif kind == "image":
        await session.feed_image(_b64(m.get("data")), ts)
    elif kind == "text":
        await session.feed_text(str(m.get("text", "")), ts)
    elif kind == "frame":
        await session.feed_frame(_b64(m.get("data")), ts)
    elif kind == "rename_speaker":
        session.rename_speaker(m.get("speaker"), m.get("name"))
    else:
        raise InvalidParameter(f"unknown message type {kind!r} (audio, image, frame, text, rename_speaker, end)")


def _b64(value: object) -> bytes:
    try:
        return base64.b64decode(str(value or ""), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParameter("data must be base64") from exc


async def _write(ws: WebSocket, session: StreamSession) -> None:
    last: Event | None = None
    async for last in session.outgoing():
        await _send(ws, last)
    if last is not None and last.TYPE == "error" and session.error is not None:
        await ws.close(code=close_code(session.error), reason=session.error.code)
    else:
        await ws.close(code=1000)
