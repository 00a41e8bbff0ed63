"""OpenAI's Realtime API, transcription sessions: ``WS /v1/realtime`` (the path OpenAI's clients build from
``base_url + "/realtime"``, with ``?model=`` or ``?intent=transcription``), served by the StreamService that
/v1/streams and the SDK's in-process streams use (scheduler, SLO classes, admission, the stream log).

The socket speaks OpenAI's events (openai_realtime_events.py); each stretch of audio between commits is one stream
of the service, opened at its first ``input_audio_buffer.append`` with the session's settings:

- server VAD on (the default): the stream's own commit policy cuts utterances. An utterance's first partial gives
  ``input_audio_buffer.speech_started``, the growth of its stable words (LocalAgreement-2) gives append-only
  ``conversation.item.input_audio_transcription.delta`` events, and its final gives ``speech_stopped``,
  ``committed`` and ``completed`` (each final is one item).
- turn detection off (``null``): the client's ``input_audio_buffer.commit`` ends the stream; everything it said
  is one item: ``committed`` at once, its finals as deltas, ``completed`` when the stream has closed.
- ``input_audio_buffer.commit`` (VAD on) ends the stream too: speech not yet cut is committed then.
- ``input_audio_buffer.clear`` drops the current stream: what it had not yet reported as committed is dropped.
- translations (``session.linguafusion.target_languages``): ``conversation.item.input_audio_translation.delta``
  (a preview: the first target's translation of a partial whose words are all stable, where it extends what was
  sent) and ``.completed`` (every target, from the finals).

Keys: ``Authorization: Bearer`` (what OpenAI's clients send), or the subprotocol ``openai-insecure-api-key.<key>``
that browsers use. What is supported and what is not: docs/openai.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from ..config import Settings
from ..errors import ClientError, InvalidParameter, LinguaFusionError, NotFound, TooLarge, from_code
from ..json_bounds import bounds_of
from ..json_types import json_object
from ..stream.budget import check_message
from ..stream.events import Closed, Error, Final, Partial
from ..stream.protocol import close_code, parse_start
from ..stream.service import Principal, StreamService
from ..stream.session import StreamSession
from . import openai_realtime_events as ev
from .handshake import offered_secret
from .openai_compat import error_type, openai_error, realtime_model
from .openai_realtime_audio import Converter
from .openai_realtime_events import BETA, GA, Dialect, SessionConfig
from .ws import _Rate, parse_message

log = logging.getLogger("lingua_fusion.api")
KEY_SUBPROTOCOL = "openai-insecure-api-key."
SUBPROTOCOLS = ("realtime", "openai-beta.realtime-v1")


@dataclass
class Item:
    """A conversation item: one utterance (VAD on) or one commit's audio (VAD off)."""

    id: str = field(default_factory=lambda: ev.new_id("item"))
    sent: str = ""  # transcript text sent as deltas so far
    translated: str = ""  # first target's translation sent as deltas so far
    parts: list[str] = field(default_factory=list)  # VAD off: the finals' transcripts
    translations: dict[str, list[str]] = field(default_factory=dict)  # VAD off: the finals' translations
    finals: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Live:
    """One stream of the session: from the first audio after a commit or clear, to the next commit."""

    session: StreamSession
    config: SessionConfig
    offset_ms: float  # the session's audio before this stream
    fed_ms: float = 0.0  # this stream's audio
    items: dict[float, Item] = field(default_factory=dict)  # VAD on: open items by utterance start (s)
    whole: Item | None = None  # VAD off: the stream's one item
    committed: bool = False  # VAD off: its commit was announced
    dropped: bool = False  # input_audio_buffer.clear: nothing more of it is sent
    pump: asyncio.Task[None] | None = None


def install(app: FastAPI, service: StreamService, authenticate: Callable[[str | None], Awaitable[Principal]]) -> None:
    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        secret, subprotocol = _credentials(ws)
        await ws.accept(subprotocol=subprotocol)
        dialect: Dialect = BETA if ws.headers.get("openai-beta", "").lower().startswith("realtime=v1") else GA
        conn: Transcription | None = None
        try:
            who = await authenticate(secret)
            config = SessionConfig()
            model = ws.query_params.get("model")
            if model:
                config = SessionConfig(model=realtime_model(model))
            conn = Transcription(ws, service, who, dialect, config)
            await conn.run()
        except LinguaFusionError as exc:
            with contextlib.suppress(Exception):
                await ws.send_text(json.dumps(ev.openai_error_event(openai_error(exc))))
                await ws.close(code=close_code(exc), reason=exc.code)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await ws.send_text(json.dumps(ev.error_event("no message in time", code="idle_timeout")))
                await ws.close(code=4408, reason="idle_timeout")
        except WebSocketDisconnect:
            pass
        except Exception:  # a bug, not the client's doing: logged; the client still gets a code
            log.exception("realtime session failed")
            with contextlib.suppress(Exception):
                await ws.send_text(json.dumps(ev.error_event("internal error; see the server log", code="internal",
                                                             kind="server_error")))
                await ws.close(code=1011, reason="internal")
        finally:
            if conn is not None:
                await conn.close()


def _credentials(ws: WebSocket) -> tuple[str | None, str | None]:
    """(the key, the subprotocol to answer with): the Authorization header, else the browser's
    ``openai-insecure-api-key.<key>`` subprotocol (answered with ``realtime``, never the key)."""
    return offered_secret(ws, answers=tuple(SUBPROTOCOLS), prefix=KEY_SUBPROTOCOL)


class Transcription:
    """One realtime transcription session (one socket): client events in, streams of the service, server events
    out."""

    def __init__(self, ws: WebSocket, service: StreamService, who: Principal, dialect: Dialect,
                 config: SessionConfig) -> None:
        self.ws, self.service, self.who, self.dialect = ws, service, who, dialect
        self.settings: Settings = service.settings
        self.config = config
        self.convert = Converter(config.format, config.rate)
        self.live: Live | None = None  # the stream new audio goes to
        self.ending: set[Live] = set()  # streams ended by a commit, still sending their last events
        self.clock_ms = 0.0  # audio received in this session
        self.last_item: str | None = None
        self._send_lock = asyncio.Lock()

    # ---- the socket ----------------------------------------------------------------------------------------
    async def send(self, *events: ev.ServerEvent) -> None:
        """Send ``events`` together: nothing another task sends comes between them."""
        async with self._send_lock:
            for event in events:
                await self.ws.send_text(json.dumps(event, ensure_ascii=False))

    async def run(self) -> None:
        await self.send(ev.session_event(self.config, self.dialect, created=True))
        idle, max_bytes = self.settings.server.stream_idle_timeout_s, self.settings.server.max_ws_message_bytes
        rate = _Rate(self.settings.server.max_ws_messages_per_s)
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), timeout=idle)
            if msg["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(msg.get("code", 1000))
            await rate.pace()  # a fast client is slowed down, never closed
            text = msg.get("text")
            if text is None:
                await self.send(ev.error_event("send JSON client events as text messages", code="invalid_event"))
                continue
            if len(text) > max_bytes:
                raise TooLarge(f"message over {max_bytes} bytes")
            await self.on(text)

    async def on(self, text: str) -> None:
        """One client event; a bad one is answered with an ``error`` event and the session goes on."""
        event_id = None
        try:
            # strictly: a lone surrogate parsed here failed at the echo of the event (1011, a traceback); too
            # deep or too many elements is a too_large error event, measured before parsing (json_bounds.py)
            msg = await parse_message(text, "client events are JSON objects, strictly: no NaN / Infinity, no lone "
                                      "UTF-16 surrogate (\\ud800-\\udfff) in a string", bounds_of(self.settings))
            if not isinstance(msg, dict):
                raise InvalidParameter("client events are JSON objects")
            named = msg.get("event_id")
            event_id = named if isinstance(named, str) else None
            kind = msg.get("type")
            if kind == "input_audio_buffer.append":
                await self.append(msg.get("audio"))
            elif kind == "input_audio_buffer.commit":
                await self.commit()
            elif kind == "input_audio_buffer.clear":
                await self.clear()
            elif kind in ("session.update", "transcription_session.update"):
                await self.update(msg.get("session"), BETA if kind.startswith("transcription") else self.dialect)
            else:
                raise InvalidParameter(f"{kind!r} is not served: this is a transcription session "
                                       "(session.update, input_audio_buffer.append / commit / clear)",
                                       details={"field": "type"})
        except ClientError as exc:
            error = openai_error(exc)
            await self.send(ev.error_event(error["message"], code=error["code"], param=error["param"],
                                           client_event_id=event_id,
                                           details=json_object(exc.details) if exc.details else None))

    # ---- client events -------------------------------------------------------------------------------------
    async def update(self, session: object, dialect: Dialect) -> None:
        config = self.config.updated(session)
        parse_start(config.start_message(), self.service.executor.registry.mt_route, [])  # languages, pairs, slo
        if config.glossary_id and self.service.glossary_for is not None:
            try:
                await self.service.glossary_for(self.who, config.glossary_id)  # 404: not this key's
            except NotFound as exc:
                raise NotFound(exc.message, details={"field": "glossary_id"}) from exc
        if (config.format, config.rate) != (self.config.format, self.config.rate):
            self.convert = Converter(config.format, config.rate)
        self.config = config
        await self.send(ev.session_event(config, dialect, created=False))

    async def append(self, audio: object) -> None:
        try:
            raw = base64.b64decode(str(audio or ""), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidParameter("audio must be base64", details={"field": "audio"}) from exc
        check_message(self.convert.seconds_in(raw), self.settings.limits.max_audio_burst_s)  # before any work
        convert = self.convert
        pcm = await asyncio.to_thread(convert, raw)  # G.711 resampling: ~0.2 s of CPU per minute, off the loop
        if not pcm:
            return
        live = self.live or await self._open()
        ms = self.convert.ms(pcm)
        self.clock_ms += ms
        live.fed_ms += ms
        await live.session.feed_audio(pcm)

    async def commit(self) -> None:
        live = self.live
        if live is None:
            await self.send(ev.error_event("the input audio buffer is empty: append audio before committing",
                                           code="input_audio_buffer_commit_empty"))
            return
        self.live = None
        self.ending.add(live)
        if live.whole is not None:
            # the commit, then what its finals said so far, as one send (the pump's next delta comes after)
            item, live.committed = live.whole, True
            item.sent = " ".join(item.parts)
            events: list[ev.ServerEvent] = [ev.committed(item.id, self.last_item)]
            if item.sent:
                events.append(ev.transcription_delta(item.id, item.sent))
            self.last_item = item.id
            await self.send(*events)
        await live.session.end()

    async def clear(self) -> None:
        live, self.live = self.live, None
        if live is not None:
            live.dropped = True
            live.session.abort()
        await self.send(ev.cleared())

    async def _open(self) -> Live:
        opened = await self.service.open(self.config.start_message(), self.who)  # admission, quota, the log
        live = Live(opened.session, self.config, self.clock_ms)
        if not self.config.turn_detection:
            live.whole = Item()
        live.pump = asyncio.create_task(self._pump(live), name="realtime-pump")
        self.live = live
        return live

    async def close(self) -> None:
        for live in [*self.ending, *([self.live] if self.live else [])]:
            live.dropped = True
            live.session.abort()
            if live.pump is not None:
                live.pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await live.pump

    # ---- stream events -> OpenAI events --------------------------------------------------------------------
    async def _pump(self, live: Live) -> None:
        try:
            async for event in live.session.outgoing():
                if live.dropped:
                    continue
                if isinstance(event, Final):
                    await (self._final(live, event) if live.whole is None else self._whole_final(live, event))
                elif isinstance(event, Partial):  # and Revision
                    if live.whole is None:
                        await self._partial(live, event)
                elif isinstance(event, Error):
                    status = from_code(event.code, event.message).status
                    await self.send(ev.error_event(event.message, code=event.code, kind=error_type(status),
                                                   details=event.details))
                elif isinstance(event, Closed) and live.whole is not None and live.committed:
                    await self._whole_completed(live)
        except (WebSocketDisconnect, RuntimeError):  # the socket closed under us: the session closes it all
            pass
        finally:
            self.ending.discard(live)
            if self.live is live:
                self.live = None  # it ended by itself (shed, drain): the next audio opens another stream

    def _ms(self, live: Live, seconds: float) -> float:
        return live.offset_ms + seconds * 1000

    async def _partial(self, live: Live, p: Partial) -> None:
        if not p.source_text.strip():
            return
        item = live.items.get(p.start)
        if item is None:
            item = live.items[p.start] = Item()
            await self.send(ev.speech_started(item.id, self._ms(live, p.start)))
        if len(p.stable_text) > len(item.sent) and p.stable_text.startswith(item.sent):
            delta = p.stable_text[len(item.sent):]
            item.sent = p.stable_text
            await self.send(ev.transcription_delta(item.id, delta))
        # a translation preview only of a hypothesis that is stable as a whole (its translation is of settled
        # words), and only where it extends what was sent: the ``.completed`` event is the translation
        whole = p.stable_text.split() == p.source_text.split()
        if live.config.targets and whole and p.text.startswith(item.translated) and p.text != item.translated:
            delta, item.translated = p.text[len(item.translated):], p.text
            await self.send(ev.translation_delta(item.id, live.config.targets[0], delta))

    async def _final(self, live: Live, f: Final) -> None:
        item = live.items.pop(f.start, None)
        if item is None:
            item = Item()
            await self.send(ev.speech_started(item.id, self._ms(live, f.start)))
        await self.send(ev.speech_stopped(item.id, self._ms(live, f.end)))
        await self.send(ev.committed(item.id, self.last_item))
        self.last_item = item.id
        if f.failed and "asr" in f.failed:
            await self.send(ev.transcription_failed(item.id, f.note or "speech recognition failed", "asr_failed"))
            return
        if f.source_text.startswith(item.sent) and len(f.source_text) > len(item.sent):
            await self.send(ev.transcription_delta(item.id, f.source_text[len(item.sent):]))
        await self.send(ev.transcription_completed(item.id, f.source_text, f.end - f.start,
                                                   self._extension(live, [f])))
        for target in live.config.targets:
            text = f.translations.get(target, "")
            if target == live.config.targets[0] and text.startswith(item.translated) and text != item.translated:
                await self.send(ev.translation_delta(item.id, target, text[len(item.translated):]))
            await self.send(ev.translation_completed(item.id, target, text))

    async def _whole_final(self, live: Live, f: Final) -> None:
        item = live.whole
        assert item is not None
        item.finals.append(f.seq)
        if not f.source_text:
            return
        before = " ".join(item.parts)
        item.parts.append(f.source_text)
        for target in live.config.targets:
            item.translations.setdefault(target, []).append(f.translations.get(target, ""))
        if live.committed:
            delta = f.source_text if not before else " " + f.source_text
            item.sent += delta
            await self.send(ev.transcription_delta(item.id, delta))

    async def _whole_completed(self, live: Live) -> None:
        item = live.whole
        assert item is not None
        await self.send(ev.transcription_completed(item.id, " ".join(item.parts), live.fed_ms / 1000,
                                                   {"stream_id": live.session.spec.stream_id,
                                                    "finals": item.finals}))
        for target in live.config.targets:
            text = " ".join(t for t in item.translations.get(target, []) if t)
            await self.send(ev.translation_completed(item.id, target, text))

    @staticmethod
    def _extension(live: Live, finals: list[Final]) -> ev.ItemExtension:
        f = finals[-1]
        out: ev.ItemExtension = {"stream_id": live.session.spec.stream_id, "finals": [x.seq for x in finals],
                               "start_s": round(live.offset_ms / 1000 + f.start, 3),
                               "end_s": round(live.offset_ms / 1000 + f.end, 3), "confidence": f.confidence}
        if f.gated is not None:
            out["gated"] = f.gated
        if f.note is not None:
            out["note"] = f.note
        if f.low_confidence is not None:
            out["low_confidence"] = f.low_confidence
        if f.durable is not None:
            out["durable"] = f.durable
        return out
