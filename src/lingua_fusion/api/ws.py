"""WebSocket live streams: ``WS /v1/streams``. Protocol in docs/streaming.md.

Close codes: 4000 + the HTTP status of the error (4400 bad start message, 4401 unauthenticated, 4403 forbidden,
4408 idle, 4413 message too large, 4429 overloaded: admission refused, or a client that stopped reading).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
import time
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from .. import langs
from ..engine.hub import StreamHub
from ..serving.scheduler import SLO_CLASSES
from ..engine.session import INPUTS, POLICIES, StreamSession, StreamSpec, spec_from_dict
from ..stream.storelink import STORE_WAIT_S
from ..errors import ClientError, InvalidParameter, PermissionDenied, LinguaFusionError, Overloaded, TooLarge


def close_code(err: LinguaFusionError) -> int:
    if err.code == "draining":
        return 1012  # service restart: reconnect
    return 4000 + err.status if 400 <= err.status < 500 else 1011


def parse_start(msg: dict[str, Any], hub: StreamHub, glossary: Any) -> StreamSpec:
    if msg.get("type") != "start":
        raise InvalidParameter("the first message must be {\"type\": \"start\", ...}")
    source = langs.normalize(msg.get("source_lang") or "en", field="source_lang")
    raw_targets = msg.get("target_langs") or ([msg["target_lang"]] if msg.get("target_lang") else [])
    if not raw_targets or not isinstance(raw_targets, list) or len(raw_targets) > 8:
        raise InvalidParameter("target_langs must list 1 to 8 languages")
    targets = [langs.normalize(t, field="target_langs") for t in raw_targets]
    for t in targets:
        if t != source:
            hub.registry.mt_route(source, t)  # raises unsupported_pair with the served pairs
    slo = str(msg.get("slo", "standard"))
    if slo not in SLO_CLASSES:
        raise InvalidParameter(f"slo must be one of {sorted(SLO_CLASSES)}")
    try:
        importance = float(msg.get("importance", msg.get("priority", 0.5)))
        min_conf = float(msg.get("min_confidence", 0.4))
    except (TypeError, ValueError) as exc:
        raise InvalidParameter("importance and min_confidence must be numbers in [0, 1]") from exc
    if not (0.0 <= importance <= 1.0 and 0.0 <= min_conf <= 1.0):
        raise InvalidParameter("importance and min_confidence must be numbers in [0, 1]")
    offsets = msg.get("clock_offsets") or {}
    if not isinstance(offsets, dict) or any(k not in ("image", "text") or not isinstance(v, int | float)
                                            or abs(v) > 60 for k, v in offsets.items()):
        raise InvalidParameter("clock_offsets maps 'image' / 'text' to seconds (|offset| <= 60)")
    audio_format = str(msg.get("audio_format", "pcm16")).lower()
    if audio_format not in {"pcm16", "webm", "ogg"}:
        raise InvalidParameter("audio_format must be pcm16, webm or ogg (Opus)")
    inputs = msg.get("inputs", list(INPUTS))
    if not isinstance(inputs, list) or not inputs or any(i not in INPUTS for i in inputs):
        raise InvalidParameter("inputs lists what the stream will send: a non-empty subset of audio, image, text")
    return StreamSpec(source_lang=source, targets=targets, slo=slo, importance=importance,
                      partials=bool(msg.get("partials", True)), glossary=glossary, min_confidence=min_conf,
                      speech=bool(msg.get("speech", False)), audio_format=audio_format,
                      clock_offsets={k: float(v) for k, v in offsets.items()}, inputs=sorted(set(inputs)))


async def _resume_spec(hub: StreamHub, resume: Any) -> tuple[StreamSpec, dict[str, Any], int]:
    """A reconnecting client: {"stream_id", "resume_token", "last_seq"} -> the stored spec and snapshot."""
    if not isinstance(resume, dict) or not resume.get("stream_id") or not resume.get("resume_token"):
        raise InvalidParameter("resume needs stream_id, resume_token and last_seq")
    store = getattr(hub, "store", None)
    if store is None:
        raise InvalidParameter("this engine keeps no stream log: streams cannot be resumed")
    try:
        last_seq = int(resume.get("last_seq", 0))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidParameter("last_seq must be an integer") from exc
    if not 0 <= last_seq < 2**53:
        raise InvalidParameter("last_seq must be an integer from 0 to 2**53")
    stream_id, token = str(resume["stream_id"]), str(resume["resume_token"])
    await hub.wait_backlog(stream_id, STORE_WAIT_S)  # a closed session's last finals first
    snapshot = await _store_call(hub, "resume", stream_id, token)
    return spec_from_dict(snapshot["spec"], stream_id, token), snapshot, last_seq


async def _store_call(hub: StreamHub, method: str, *args: Any) -> Any:
    if hub.link is None:
        return getattr(hub.store, method)(*args)
    return await hub.link.call(method, *args, wait_s=STORE_WAIT_S)


def install(app: FastAPI, hubs: dict[str, StreamHub], authenticate: Any, glossary_for: Any) -> None:
    """``hubs``: "batched" serves every stream; "per-stream" (the benchmark baseline) serves streams whose start
    message asks for ``"engine": "per-stream"``, for admin keys only."""
    settings = hubs["batched"].settings
    per_key: dict[str, int] = {}

    @app.websocket("/v1/streams")
    async def streams(ws: WebSocket) -> None:
        await ws.accept()
        session: StreamSession | None = None
        key_id = ""
        try:
            # read the start message before judging the key, so a refused client always gets the error event
            # (closing first would race with the client's own first send)
            first = await asyncio.wait_for(ws.receive(), timeout=settings.server.stream_idle_timeout_s)
            if first["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(first.get("code", 1000))
            raw = first.get("text")
            if raw is None:
                raise InvalidParameter("the first message must be the JSON start message, not binary data")
            token = ws.headers.get("authorization", "")
            secret = token[7:].strip() if token.lower().startswith("bearer ") else ws.query_params.get("api_key")
            key = authenticate(secret)
            key_id = key.key_id
            if len(raw) > 64 * 1024:
                raise TooLarge("start message too large")
            try:
                msg = json.loads(raw)
            except ValueError as exc:
                raise InvalidParameter("the start message must be JSON") from exc
            if not isinstance(msg, dict):
                raise InvalidParameter("the start message must be a JSON object")
            engine = str(msg.get("engine", "batched"))
            if engine not in hubs:
                raise InvalidParameter(f"engine must be one of {sorted(hubs)}")
            if engine != "batched" and "admin" not in key.scopes:
                raise PermissionDenied("the per-stream baseline engine is for benchmarks: it needs an admin key")
            hub = hubs[engine]
            resume = msg.get("resume")
            snapshot: dict[str, Any] | None = None
            if resume is not None:
                spec, snapshot, last_seq = await _resume_spec(hub, resume)
                old = hub.sessions.get(spec.stream_id)
                if old is not None:
                    # the client saw the break before this server did: end the old session, then read the log
                    # again, so nothing the old session logged meanwhile is numbered twice
                    await old.abort()
                    spec, snapshot, last_seq = await _resume_spec(hub, resume)
                if last_seq > int(snapshot.get("last_seq", 0)):
                    # the server died holding finals it had sent but not logged (the log was down): number on
                    # from what the client has, so no seq is reused; their audio, re-sent from committed_until,
                    # is transcribed again
                    snapshot = {**snapshot, "last_seq": last_seq}
            else:
                terms = glossary_for(key, msg.get("glossary_id")) if msg.get("glossary_id") else []
                spec = parse_start(msg, hub, terms)
            if per_key.get(key_id, 0) >= settings.server.max_streams_per_key:
                raise Overloaded("this key has too many open streams", retry_after=5.0)
            if hub.draining:
                raise Overloaded("the server is shutting down; connect again shortly", retry_after=2.0)
            hub.admit(hub.demand(spec.stream_id, spec.slo, spec.source_lang, spec.targets, spec.partials,
                                 POLICIES[spec.slo].step_s, inputs=spec.inputs))
            per_key[key_id] = per_key.get(key_id, 0) + 1
            session = StreamSession(hub, spec, resume=snapshot)
            hub.sessions[spec.stream_id] = session
            await ws.send_json(await session.open())
            if snapshot is not None:
                replay = await _store_call(hub, "finals_after", spec.stream_id, last_seq)
                log_from = int(snapshot.get("log_from", 1))
                if last_seq + 1 < log_from:  # compaction dropped finals this client never saw: say so
                    await ws.send_json({"type": "error", "code": "log_compacted",
                                        "message": f"finals {last_seq + 1}..{log_from - 1} are past the log's "
                                                   f"retention and cannot be replayed"})
                for event in (e for e in replay if int(e["seq"]) > last_seq):
                    await ws.send_json(event)  # committed finals the client missed, exactly once, in order
                if snapshot.get("closed"):
                    await ws.send_json({"type": "closed", "reason": "end of stream", "finals": session.seq})
                    await ws.close(code=1000)
                    return
            writer = asyncio.create_task(_write(ws, session), name="ws-writer")
            try:
                await _read(ws, session, settings.server.stream_idle_timeout_s,
                            settings.server.max_ws_message_bytes, settings.server.max_ws_messages_per_s)
                await writer
            finally:
                if not writer.done():
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await writer
        except LinguaFusionError as exc:
            with contextlib.suppress(Exception):
                await ws.send_json({"type": "error", "code": exc.code, "message": exc.message,
                                    **({"details": exc.details} if exc.details else {})})
                await ws.close(code=close_code(exc), reason=exc.code)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await ws.send_json({"type": "error", "code": "idle_timeout", "message": "no message in time"})
                await ws.close(code=4408, reason="idle_timeout")
        except WebSocketDisconnect:
            pass
        finally:
            if session is not None:
                await session.abort()
                per_key[key_id] = max(0, per_key.get(key_id, 1) - 1)


class _Rate:
    """A token bucket: ``rate`` messages per second on average, bursts up to two seconds' worth."""

    def __init__(self, rate: float) -> None:
        self.rate, self.capacity = rate, 2 * rate
        self.tokens = self.capacity
        self.t = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


async def _read(ws: WebSocket, session: StreamSession, idle: float, max_bytes: int, max_rate: float) -> None:
    rate = _Rate(max_rate)
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=idle)
        if not rate.take():
            raise Overloaded(f"more than {max_rate:g} messages per second on this stream", retry_after=1.0)
        if msg["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(msg.get("code", 1000))
        if session.closed.is_set():
            return  # the session ended itself (slow consumer, shed, drain): the writer says why and closes
        data = msg.get("bytes")
        if data is not None:
            if len(data) > max_bytes:
                raise TooLarge(f"message over {max_bytes} bytes")
            try:
                await session.feed_audio(data)
            except ClientError as exc:  # one bad frame: say so, keep the stream
                if session.closed.is_set():
                    return
                await session.notify({"type": "error", "code": exc.code, "message": exc.message})
            continue
        text = msg.get("text") or ""
        if len(text) > max_bytes:
            raise TooLarge(f"message over {max_bytes} bytes")
        try:
            m = json.loads(text)
        except ValueError as exc:
            raise InvalidParameter("messages must be JSON objects or binary PCM16 audio") from exc
        kind = m.get("type") if isinstance(m, dict) else None
        ts = m.get("ts") if isinstance(m, dict) else None
        if ts is not None and (not isinstance(ts, int | float) or not math.isfinite(ts)):
            raise InvalidParameter("ts must be a finite number of seconds")
        if kind == "end":
            await session.end()
            return
        try:
            if kind == "audio":
                await session.feed_audio(_b64(m.get("data")), ts)
            elif kind == "image":
                await session.feed_image(_b64(m.get("data")), ts)
            elif kind == "text":
                await session.feed_text(str(m.get("text", "")), ts)
            else:
                raise InvalidParameter(f"unknown message type {kind!r} (audio, image, text, end)")
        except ClientError as exc:  # one bad message: say so, keep the stream
            if isinstance(exc, TooLarge):
                raise
            if session.closed.is_set():
                return
            # never blocks: a client that sends bad messages and reads nothing is closed as a slow consumer
            await session.notify({"type": "error", "code": exc.code, "message": exc.message})


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value or ""), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidParameter("data must be base64") from exc


async def _write(ws: WebSocket, session: StreamSession) -> None:
    while True:
        get = asyncio.ensure_future(session.events.get())
        closed = asyncio.ensure_future(session.closed.wait())
        done, _ = await asyncio.wait({get, closed}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            closed.cancel()
            event = get.result()
            await ws.send_json(event)
            if event["type"] == "closed":
                await ws.close(code=1000)
                return
            continue
        get.cancel()
        # closed without a "closed" event: drain what is queued, then say why
        while not session.events.empty():
            await ws.send_json(session.events.get_nowait())
        err = session.error
        if err is not None:
            await ws.send_json({"type": "error", "code": err.code, "message": err.message})
            await ws.close(code=close_code(err), reason=err.code)
        else:
            await ws.close(code=1000)
        return
