"""Live streams from Python: ``async with translator.stream(target_langs=["es"]) as s:``.

``send_audio`` takes PCM16 little-endian mono 16 kHz bytes (with an optional media timestamp in seconds);
iterating the handle yields ``StreamEvent`` objects until the server closes the stream.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, TypedDict, TypeGuard

from pydantic import BaseModel, ConfigDict

from ..errors import BackendError, LinguaFusionError
from ..json_types import JSONValue
from ..stream.budget import Bucket
from .common import error_of

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from ..stream.events import Event
    from ..stream.service import StreamService
    from ..stream.session import StreamSession

log = logging.getLogger("lingua_fusion.sdk")
# a stream's start message as the SDK writes it (json.dumps; the server checks every field): the caller adds fields
StartMessage = dict[str, object]


class StreamEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    seq: int | None = None
    start: float | None = None
    end: float | None = None
    source_text: str | None = None
    text: str | None = None
    translations: dict[str, str] | None = None


def start_message(target_langs: list[str], source_lang: str, slo: str, partials: bool, importance: float,
                  glossary_id: str | None, speech: bool, min_confidence: float,
                  audio_format: str = "pcm16", inputs: list[str] | None = None) -> StartMessage:
    msg: StartMessage = {"type": "start", "source_lang": source_lang, "target_langs": target_langs, "slo": slo,
                         "partials": partials, "importance": importance, "speech": speech,
                         "min_confidence": min_confidence, "audio_format": audio_format}
    if inputs is not None:
        msg["inputs"] = inputs
    if glossary_id:
        msg["glossary_id"] = glossary_id
    return msg


def speakers(start: StartMessage, diarize: bool, max_speakers: int | None) -> None:
    """A start message's ``diarize`` and ``max_speakers`` (the server checks them: a bad value is
    ``invalid_parameter``)."""
    if diarize:
        start["diarize"] = diarize
    if max_speakers is not None:
        start["max_speakers"] = max_speakers


class ReadyJSON(TypedDict, total=False):
    """The stream's ``ready`` event (``stream.events.Ready`` on the wire): its id and resume token, and what the
    server says of the stream; a resumed stream's adds ``resumed`` and where it resumes from."""

    type: str
    stream_id: str
    resume_token: str
    slo: str
    source_lang: str
    targets: list[str]
    partials: bool
    room_id: str
    listener_token: str
    listener_token_id: str
    max_audio_speed: float
    max_audio_burst_s: float
    scripts: dict[str, str]
    source_langs: list[str]
    max_speakers: int
    speaker_names: dict[str, str]
    resumed: bool
    last_seq: int
    resume_from: float
    resume_from_ts: float


_NUMBER = (int, float)
_READY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "type": str, "stream_id": str, "resume_token": str, "slo": str, "source_lang": str, "targets": list,
    "partials": bool, "room_id": str, "listener_token": str, "listener_token_id": str, "max_audio_speed": _NUMBER,
    "max_audio_burst_s": _NUMBER, "scripts": dict, "source_langs": list, "max_speakers": int,
    "speaker_names": dict, "resumed": bool, "last_seq": int, "resume_from": _NUMBER, "resume_from_ts": _NUMBER}


def is_ready(event: Mapping[str, object]) -> TypeGuard[ReadyJSON]:
    """A ``ready`` event: a stream id and resume token, and each other field it has of its type."""
    return (isinstance(event.get("stream_id"), str) and isinstance(event.get("resume_token"), str)
            and all(isinstance(event[k], t) for k, t in _READY_FIELDS.items() if event.get(k) is not None))


Notice = Callable[["RemoteStream"], object]  # on_break / on_reconnect: called with the stream


class RemoteStream:
    """A live stream over WebSocket that survives server restarts.

    Audio, and text and images sent with a timestamp, are kept in a bounded buffer (the last ``buffer_s`` seconds
    of stream time). When the connection breaks (anything but the
    server's normal close after ``closed``), the stream reconnects with backoff, resumes with its stream id, resume
    token and the last sequence number it saw, re-sends what the server has not committed yet, and
    iteration goes on: every committed final arrives exactly once, in order.
    """

    def __init__(self, url: str, api_key: str | None, start: StartMessage, open_timeout: float = 30.0, *,
                 reconnect: bool = True, reconnect_timeout: float = 120.0, buffer_s: float = 120.0,
                 on_reconnect: Notice | None = None, on_break: Notice | None = None) -> None:
        self._url = url
        self._key = api_key
        self._start = start
        self._open_timeout = open_timeout
        self._reconnect = reconnect
        self._reconnect_timeout = reconnect_timeout
        self._buffer: deque[tuple[float, float, str]] = deque()  # (ts, seconds of audio, message)
        self._buffer_s = buffer_s
        self._ws: ClientConnection | None = None
        self._lock = asyncio.Lock()
        self._connected = asyncio.Event()
        self._repair: asyncio.Task[None] | None = None
        self._next_ts = 0.0
        self._ended = False
        self._finished = False
        self.last_seq = 0
        self.reconnects = 0
        self.duplicates_dropped = 0  # finals the server sent again after a resume (dropped here, counted)
        self.on_reconnect = on_reconnect
        self.on_break = on_break  # called with this stream when a connection breaks, before reconnecting
        self.ready: ReadyJSON = {}
        self._budget: Bucket | None = None  # the server's audio budget, kept on this side (``_pace``)

    @property
    def reconnect_timeout(self) -> float:
        """How long a broken connection is retried before the stream fails."""
        return self._reconnect_timeout

    async def _open(self, resume: bool) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        start = dict(self._start)
        if resume:
            start["resume"] = {"stream_id": self.ready["stream_id"], "resume_token": self.ready["resume_token"],
                               "last_seq": self.last_seq}
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else None
        try:
            ws = await connect(self._url, additional_headers=headers, open_timeout=self._open_timeout,
                               max_size=16 * 1024 * 1024)
            await ws.send(json.dumps(start))
            first: JSONValue = json.loads(await asyncio.wait_for(ws.recv(), timeout=self._open_timeout))
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise BackendError(f"cannot open a stream at {self._url}: {exc}") from exc
        if not isinstance(first, dict):  # a greeting that is no JSON object: not a LinguaFusion stream
            await ws.close()
            raise BackendError(f"{self._url} answered the stream's start with no JSON object")
        if first.get("type") == "error":
            await ws.close()
            raise error_of(first, "stream refused")
        if not resume:
            if not is_ready(first):  # a greeting without its stream id: not a LinguaFusion stream
                await ws.close()
                raise BackendError(f"{self._url} greeted the stream with no ready event",
                                   details={"fields": sorted(first)[:20]})
            self._ws = ws
            self.ready = first
            return
        self._ws = ws
        # re-send what the server had not committed when it went away
        since = first.get("resume_from_ts")
        if not isinstance(since, (int, float)):
            since = None
        try:
            for ts, dur, message in list(self._buffer):
                # audio after what the server committed; every kept text and image (the server drops text it
                # had already logged, and reading a slide again is harmless)
                if dur == 0.0 or since is None or ts + dur > since:
                    await ws.send(message)
            if self._ended:
                await ws.send(json.dumps({"type": "end"}))
        except WebSocketException:
            pass  # the stream had already ended: the server replays its last finals, says closed, and hangs up

    async def __aenter__(self) -> RemoteStream:
        await self._open(resume=False)
        self._connected.set()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._finished = True
        if self._repair is not None and not self._repair.done():
            self._repair.cancel()
        if self._ws is not None:
            await self._ws.close()

    async def _reconnect_loop(self) -> None:
        deadline = asyncio.get_running_loop().time() + self._reconnect_timeout
        delay = 0.25
        while True:
            try:
                async with self._lock:
                    await self._open(resume=True)
                self.reconnects += 1
                self._notify(self.on_reconnect)
                self._connected.set()
                return
            except LinguaFusionError as exc:  # unreachable, or draining / overloaded: both retryable
                if not exc.retryable or asyncio.get_running_loop().time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    def _notify(self, fn: Notice | None) -> None:
        """Call a caller's notice (on_break, on_reconnect) with this stream; its failure is logged, not raised."""
        if fn is None:
            return
        try:
            fn(self)
        except Exception:
            log.exception("stream: a notice callback failed")

    async def _broken(self) -> None:
        """Start (or join) the one reconnection for this break, and wait for it."""
        if not self._reconnect:
            raise BackendError("the stream connection broke")
        self._connected.clear()
        if self._repair is None or self._repair.done():
            self._notify(self.on_break)  # a new break: say so before the (up to reconnect_timeout) retries
            self._repair = asyncio.create_task(self._reconnect_loop())
        await asyncio.shield(self._repair)

    async def _send(self, message: str, ts: float | None = None, dur: float = 0.0) -> None:
        from websockets.exceptions import ConnectionClosed

        await self._connected.wait()
        try:
            async with self._lock:
                # kept under the lock: a reconnection re-sends exactly what was kept before it, and what is kept
                # after it goes out once, here
                self._keep(ts, dur, message)
                await self._socket().send(message)
        except ConnectionClosed:
            await self._broken()  # the buffer holds the audio: the reconnection re-sends it

    async def send_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        if ts is None:
            ts = self._next_ts
        self._next_ts = ts + len(pcm16) / 32000
        message = json.dumps({"type": "audio", "ts": ts, "data": base64.b64encode(pcm16).decode()})
        await self._pace(len(pcm16) / 32000)
        await self._send(message, ts, len(pcm16) / 32000)

    async def _pace(self, seconds: float) -> None:
        """Send audio no faster than the server reads it (its ``ready`` says how fast: stream/budget.py), a little
        under: a client ahead of the server's budget waits on TCP, and its keepalive pings wait behind its own
        audio until the connection times out. An older server that says nothing is not paced."""
        speed, burst = self.ready.get("max_audio_speed"), self.ready.get("max_audio_burst_s")
        if not isinstance(speed, (int, float)) or not isinstance(burst, (int, float)) or not speed or not burst:
            return
        if self._budget is None:
            self._budget = Bucket(0.9 * float(speed), 0.9 * float(burst), time.monotonic)
        wait = self._budget.charge(seconds)
        if wait > 0:
            await asyncio.sleep(wait)

    def _keep(self, ts: float | None, dur: float, message: str) -> None:
        """Buffer a timestamped message for re-sending after a break (the last ``buffer_s`` s of stream time)."""
        if ts is None:
            return  # without a timestamp the server cannot tell whether it was committed: not re-sent
        self._buffer.append((ts, dur, message))
        newest = max(ts + dur, self._next_ts)
        while self._buffer and self._buffer[0][0] < newest - self._buffer_s:
            self._buffer.popleft()

    async def send_image(self, data: bytes, ts: float | None = None) -> None:
        await self._send(json.dumps({"type": "image", "ts": ts, "data": base64.b64encode(data).decode()}), ts)

    async def send_frame(self, data: bytes, ts: float | None = None) -> None:
        """A video frame (png / jpeg / webp) at media time ``ts``: slides are read when the picture changes."""
        await self._send(json.dumps({"type": "frame", "ts": ts, "data": base64.b64encode(data).decode()}), ts)

    async def send_text(self, text: str, ts: float | None = None) -> None:
        await self._send(json.dumps({"type": "text", "ts": ts, "text": text}), ts)

    async def rename_speaker(self, speaker: str, name: str | None) -> None:
        """A ``diarize`` stream's speaker ("S1") gets a display name (None: none): a ``speaker_renamed`` event
        comes back, and later finals carry ``speaker_name``."""
        await self._send(json.dumps({"type": "rename_speaker", "speaker": speaker, "name": name}))

    async def end(self) -> None:
        self._ended = True
        await self._send(json.dumps({"type": "end"}))

    def _socket(self) -> ClientConnection:
        """The open connection (set by ``__aenter__`` and each reconnection, before ``_connected`` is)."""
        if self._ws is None:
            raise BackendError("the stream is not open: use it as ``async with translator.stream(...) as s``")
        return self._ws

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        from websockets.exceptions import ConnectionClosed

        while True:
            await self._connected.wait()
            ws = self._socket()
            try:
                raw = await ws.recv()
            except ConnectionClosed as exc:
                if ws is not self._ws:
                    continue  # a reconnection already replaced this socket
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code is not None and 4000 <= code < 5000:
                    return  # refused or shed by the server (its error event came first): reconnecting won't help
                await self._broken()
                continue
            ev = StreamEvent.model_validate(json.loads(raw))
            if ev.type == "final" and ev.seq is not None:
                if ev.seq <= self.last_seq:
                    self.duplicates_dropped += 1
                    continue  # already delivered before the break
                self.last_seq = ev.seq
            if ev.type == "ready":
                continue  # a resumed stream's greeting
            yield ev
            if ev.type == "closed":
                return


class LocalStream:
    """The same interface over an in-process StreamService (``MultimodalTranslator.local().stream(...)``): the same
    opening, admission, breaker notices, shedding and drain as a WebSocket stream."""

    def __init__(self, service: StreamService, start: StartMessage) -> None:
        self._service = service
        self._start = start
        self._session: StreamSession | None = None
        self._greeting: list[Event] = []
        self.ready: ReadyJSON = {}

    async def __aenter__(self) -> LocalStream:
        from ..stream.service import Principal

        opened = await self._service.open(self._start, Principal("local", admin=True))
        self._session = opened.session
        self._greeting = opened.greeting[1:]
        ready = opened.greeting[0].to_wire()
        if not is_ready(ready):  # the service opens a stream with its Ready event
            raise BackendError("the stream service greeted the stream with no ready event")
        self.ready = ready
        return self

    def _live(self) -> StreamSession:
        """The opened session (``__aenter__``)."""
        if self._session is None:
            raise BackendError("the stream is not open: use it as ``async with translator.stream(...) as s``")
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        self._live().abort()

    async def send_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        await self._live().feed_audio(pcm16, ts)

    async def send_image(self, data: bytes, ts: float | None = None) -> None:
        await self._live().feed_image(data, ts)

    async def send_frame(self, data: bytes, ts: float | None = None) -> None:
        await self._live().feed_frame(data, ts)

    async def send_text(self, text: str, ts: float | None = None) -> None:
        await self._live().feed_text(text, ts)

    async def rename_speaker(self, speaker: str, name: str | None) -> None:
        self._live().rename_speaker(speaker, name)

    async def end(self) -> None:
        await self._live().end()

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        for ev in self._greeting:
            yield StreamEvent.model_validate(ev.to_wire())
        async for ev in self._live().outgoing():  # what a WebSocket client is sent, the error of a shed or
            yield StreamEvent.model_validate(ev.to_wire())  # drained stream included
