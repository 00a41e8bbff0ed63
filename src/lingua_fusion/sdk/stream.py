"""Live streams from Python: ``async with translator.stream(target_langs=["es"]) as s:``.

``send_audio`` takes PCM16 little-endian mono 16 kHz bytes (with an optional media timestamp in seconds);
iterating the handle yields ``StreamEvent`` objects until the server closes the stream.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import BackendError, from_code


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
                  audio_format: str = "pcm16") -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "start", "source_lang": source_lang, "target_langs": target_langs, "slo": slo,
                           "partials": partials, "importance": importance, "speech": speech,
                           "min_confidence": min_confidence, "audio_format": audio_format}
    if glossary_id:
        msg["glossary_id"] = glossary_id
    return msg


class RemoteStream:
    def __init__(self, url: str, api_key: str | None, start: dict[str, Any], open_timeout: float = 30.0) -> None:
        self._url = url
        self._key = api_key
        self._start = start
        self._open_timeout = open_timeout
        self._ws: Any = None
        self.ready: dict[str, Any] = {}

    async def __aenter__(self) -> RemoteStream:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        headers = {"Authorization": f"Bearer {self._key}"} if self._key else None
        try:
            self._ws = await connect(self._url, additional_headers=headers, open_timeout=self._open_timeout,
                                     max_size=16 * 1024 * 1024)
            await self._ws.send(json.dumps(self._start))
            first = json.loads(await asyncio.wait_for(self._ws.recv(), timeout=self._open_timeout))
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise BackendError(f"cannot open a stream at {self._url}: {exc}") from exc
        if first.get("type") == "error":
            await self._ws.close()
            raise from_code(first.get("code", "internal"), first.get("message", "stream refused"),
                            details=first.get("details"))
        self.ready = first
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def send_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        if ts is None:
            await self._ws.send(pcm16)
        else:
            await self._ws.send(json.dumps({"type": "audio", "ts": ts, "data": base64.b64encode(pcm16).decode()}))

    async def send_image(self, data: bytes, ts: float | None = None) -> None:
        await self._ws.send(json.dumps({"type": "image", "ts": ts, "data": base64.b64encode(data).decode()}))

    async def send_text(self, text: str, ts: float | None = None) -> None:
        await self._ws.send(json.dumps({"type": "text", "ts": ts, "text": text}))

    async def end(self) -> None:
        await self._ws.send(json.dumps({"type": "end"}))

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                raw = await self._ws.recv()
            except ConnectionClosed:
                return
            ev = StreamEvent.model_validate(json.loads(raw))
            yield ev
            if ev.type == "closed":
                return


class LocalStream:
    """The same interface over an in-process hub (``MultimodalTranslator.local().stream(...)``)."""

    def __init__(self, hub: Any, start: dict[str, Any]) -> None:
        self._hub = hub
        self._start = start
        self._session: Any = None
        self.ready: dict[str, Any] = {}

    async def __aenter__(self) -> LocalStream:
        from ..api.ws import parse_start
        from ..engine.session import POLICIES, StreamSession

        spec = parse_start(self._start, self._hub, [])
        self._hub.admit(self._hub.demand(spec.stream_id, spec.slo, spec.source_lang, spec.targets, spec.partials,
                                         POLICIES[spec.slo].step_s))
        self._session = StreamSession(self._hub, spec)
        self.ready = self._session.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.abort()

    async def send_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        await self._session.feed_audio(pcm16, ts)

    async def send_image(self, data: bytes, ts: float | None = None) -> None:
        await self._session.feed_image(data, ts)

    async def send_text(self, text: str, ts: float | None = None) -> None:
        await self._session.feed_text(text, ts)

    async def end(self) -> None:
        await self._session.end()

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        while True:
            ev = await self._session.events.get()
            yield StreamEvent.model_validate(ev)
            if ev["type"] == "closed":
                return
