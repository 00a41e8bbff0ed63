"""Misbehaving WebSocket clients ("client faults") for chaos experiments, against a running server.

Each opens one stream as the SDK does (``Authorization: Bearer <key>``, the ``start`` message, then waits for
``ready``), misbehaves in one way, and returns an outcome dict::

  {"kind", "opened", "close_code", "close_reason", "closed_after_s", "events_read",
   "finals", "last_event", "last_error", "messages_sent", "last_send_s", "stream_id", ["error"]}

``close_code`` / ``close_reason`` are those of the close frame the server sent (1006: the connection was lost with
none); they stay None when the server had not closed the stream by the end (the client then closes it itself).
Times are seconds since ``ready``. ``events_read`` counts the server's messages after ``ready``, ``last_event`` is
the type of the last one, ``last_error`` the last ``error`` event ({code, message}). None of them raises on network
or protocol errors (they land in ``error``), every wait has a timeout, and each always closes its socket.

  slow_reader  sends audio at real time but reads nothing until ``read_after_s``
  half_open    goes silent after ``ready``: sends nothing, reads nothing (so answers no ping), as a hung peer
  never_end    sends audio for ``send_s``, then reads but never sends ``end`` nor anything else
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

OPEN_TIMEOUT = 30.0
SEND_TIMEOUT = 10.0  # a send blocked this long: the server stopped reading (recorded as send_stalled_s)
CLOSE_TIMEOUT = 3.0
CHUNK = 8000  # 250 ms of PCM16 mono 16 kHz
TCP_CLOSED = {7, 8}  # Linux tcpi_state: TCP_CLOSE (reset), TCP_CLOSE_WAIT (the peer sent FIN)


class _Probe:
    """One misbehaving stream: its connection, its outcome and its clock (seconds since ``ready``)."""

    def __init__(self, kind: str) -> None:
        self.out: dict[str, Any] = {"kind": kind, "opened": False, "close_code": None, "close_reason": None,
                                    "closed_after_s": None, "events_read": 0, "finals": 0, "last_event": None,
                                    "last_error": None, "messages_sent": 0, "last_send_s": None}
        self.ws: Any = None
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    async def open(self, ws_url: str, api_key: str | None, start: dict[str, Any], **kwargs: Any) -> bool:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.ws = await connect(ws_url, additional_headers=headers, open_timeout=OPEN_TIMEOUT, proxy=None,
                                close_timeout=CLOSE_TIMEOUT, max_size=16 * 1024 * 1024, **kwargs)
        await asyncio.wait_for(self.ws.send(json.dumps(start)), timeout=SEND_TIMEOUT)
        first = json.loads(await asyncio.wait_for(self.ws.recv(), timeout=OPEN_TIMEOUT))
        self.t0 = time.monotonic()
        if first.get("type") == "ready":
            self.out.update(opened=True, stream_id=first.get("stream_id"))
            return True
        self.out["error"] = f"stream refused: {first.get('code')}: {first.get('message')}"
        self.event(json.dumps(first))
        try:
            await asyncio.wait_for(self.ws.recv(), timeout=CLOSE_TIMEOUT)
        except ConnectionClosed as exc:
            self.server_closed(exc)
        except TimeoutError:
            pass
        return False

    def event(self, raw: str | bytes) -> None:
        self.out["events_read"] += 1
        with contextlib.suppress(ValueError, AttributeError):
            msg = json.loads(raw)
            self.out["last_event"] = msg.get("type")
            if msg.get("type") == "final":
                self.out["finals"] += 1
            elif msg.get("type") == "error":
                self.out["last_error"] = {"code": msg.get("code"), "message": msg.get("message")}

    def server_closed(self, exc: Exception) -> None:
        """Record the server's close once: the close frame it sent (1006 if the connection was lost without one)."""
        if self.out["close_code"] is None:
            rcvd = getattr(exc, "rcvd", None)
            self.out.update(close_code=rcvd.code if rcvd is not None else 1006,
                            close_reason=rcvd.reason if rcvd is not None else None, closed_after_s=self.now())

    async def send(self, message: str | bytes) -> bool:
        """One message, ``SEND_TIMEOUT`` at most; False once the stream is closed or the send stalled."""
        from websockets.exceptions import ConnectionClosed

        try:
            await asyncio.wait_for(self.ws.send(message), timeout=SEND_TIMEOUT)
        except ConnectionClosed as exc:
            self.server_closed(exc)
            return False
        except TimeoutError:
            self.out["send_stalled_s"] = self.now()
            return False
        self.out["messages_sent"] += 1
        self.out["last_send_s"] = self.now()
        return True

    async def send_audio(self, pcm: bytes, seconds: float, texts_per_s: float = 0.0, text: str = "",
                         end: bool = False) -> None:
        """PCM16 16 kHz at real time in 250 ms binary chunks for ``seconds`` (looping over ``pcm``), with
        ``texts_per_s`` ``text`` messages interleaved ("<n>. <text>": each makes a caption quickly); then ``end``
        if asked."""
        pcm = pcm[: len(pcm) // 2 * 2] or bytes(CHUNK)
        looped = pcm * (CHUNK // len(pcm) + 2)
        pos, i, texts = 0, 0, 0
        start = time.monotonic()
        while i * 0.25 < seconds:
            await asyncio.sleep(max(0.0, start + i * 0.25 - time.monotonic()))
            if not await self.send(looped[pos:pos + CHUNK]):
                return
            pos, i = (pos + CHUNK) % len(pcm), i + 1
            while texts < int(i * 0.25 * texts_per_s):
                texts += 1
                if not await self.send(json.dumps({"type": "text", "text": f"{texts}. {text}"})):
                    return
        if end:
            await self.send(json.dumps({"type": "end"}))

    async def read_until(self, until_s: float) -> None:
        """Read events until the server closes the stream or ``until_s`` (seconds since ready) has passed."""
        from websockets.exceptions import ConnectionClosed

        while (left := until_s - (time.monotonic() - self.t0)) > 0:
            try:
                self.event(await asyncio.wait_for(self.ws.recv(), timeout=left))
            except ConnectionClosed as exc:
                self.server_closed(exc)
                return
            except TimeoutError:
                return

    async def close(self) -> None:
        if self.ws is None:
            return
        with contextlib.suppress(Exception):
            self.ws.transport.resume_reading()
            await asyncio.wait_for(self.ws.close(), timeout=CLOSE_TIMEOUT + 1)
        self.ws.transport.abort()  # no-op once closed; otherwise do not leave the socket behind

    def failed(self, exc: Exception) -> None:
        self.out["error"] = f"{type(exc).__name__}: {exc}"


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def slow_reader(ws_url: str, api_key: str | None, start: dict[str, Any], pcm: bytes, *, seconds: float,
                      read_after_s: float, texts_per_s: float = 0.0, text: str = "This line was sent as text.",
                      linger_s: float = 10.0) -> dict[str, Any]:
    """Send audio (and ``texts_per_s`` text messages) at real time for ``seconds``, then ``end``; read nothing until
    ``read_after_s``, then read until the server closes (at most ``linger_s`` after both). Without reads the
    library's 16-frame buffer fills, the transport stops reading and the server's writes back up: the server should
    close with 4429 ``slow_consumer`` once its event queue (256) is full, or, if it holds, serve the stream to
    the end (``closed``, then 1000). The close is seen only once reading starts: a blocked socket carries none."""
    p = _Probe("slow_reader")
    try:
        if await p.open(ws_url, api_key, start):
            sender = asyncio.create_task(p.send_audio(pcm, seconds, texts_per_s, text, end=True))
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.ws.wait_closed(), timeout=read_after_s)
                p.out["reading_from_s"] = p.now()
                await p.read_until(max(seconds, read_after_s) + linger_s)
            finally:
                await _cancel(sender)
    except Exception as exc:
        p.failed(exc)
    finally:
        await p.close()
    return p.out


def _tcp_closed(sock: socket.socket) -> bool:
    """Whether the peer closed this TCP connection (FIN or RST), without reading from it (Linux TCP_INFO)."""
    try:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] in TCP_CLOSED)
    except (OSError, AttributeError):
        return False


async def half_open(ws_url: str, api_key: str | None, start: dict[str, Any], *, seconds: float) -> dict[str, Any]:
    """Open the stream, then play dead for ``seconds``: no client keepalive, and the transport stops reading, so no
    pong, no close reply and no event is taken (the kernel still ACKs: a hung process, not a vanished host; put a
    ``TcpProxy`` in ``partition`` in front of the server for that). The server's close is detected when its end of
    TCP closes (FIN/RST, polled every 0.1 s); then reading resumes to learn the close code from the buffered close
    frame. uvicorn sends the close frame at the idle timeout and closes TCP after its 10 s close timeout."""
    p = _Probe("half_open")
    try:
        if await p.open(ws_url, api_key, start, ping_interval=None):
            transport = p.ws.transport
            sock = transport.get_extra_info("socket")
            transport.pause_reading()
            at: float | None = None
            while (left := seconds - (time.monotonic() - p.t0)) > 0:
                if transport.is_closing() or _tcp_closed(sock):
                    at = p.now()
                    break
                await asyncio.sleep(min(0.1, left))
            transport.resume_reading()  # wake up: take what the server sent (its error event and close frame)
            await p.read_until(p.now() + CLOSE_TIMEOUT)
            if p.out["close_code"] is not None and at is not None:
                p.out["closed_after_s"] = at
            p.out["tcp_closed"] = at is not None
    except Exception as exc:
        p.failed(exc)
    finally:
        await p.close()
    return p.out


async def never_end(ws_url: str, api_key: str | None, start: dict[str, Any], pcm: bytes, *, send_s: float,
                    seconds: float) -> dict[str, Any]:
    """Send audio at real time for ``send_s`` while reading events, then keep reading (pings are answered: a live
    client) but send nothing more, never ``end``, for up to ``seconds`` in all: the server should close with 4408
    about its idle timeout after ``last_send_s``."""
    p = _Probe("never_end")
    try:
        if await p.open(ws_url, api_key, start):
            sender = asyncio.create_task(p.send_audio(pcm, send_s))
            try:
                await p.read_until(seconds)
            finally:
                await _cancel(sender)
    except Exception as exc:
        p.failed(exc)
    finally:
        await p.close()
    return p.out
