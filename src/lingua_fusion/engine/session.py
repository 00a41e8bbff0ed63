"""One live stream: its timeline, commit policy, ordered finals and bounded event queue.

Input (audio / image / text with media timestamps) -> timeline -> VAD -> policy decisions. A partial decode is
tentative (at most one in flight; the scheduler may shed it). A commit becomes a job (ASR -> gate -> MT per target)
queued in order; the emitter awaits jobs in that order and numbers finals 1, 2, 3, ... with no gaps. Events go to a
bounded queue: a client that stops reading gets a clear close instead of unbounded buffering.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidParameter, LinguaFusionError
from ..glossary import Term
from ..media.stream_decoder import StreamDecoder
from .hub import StreamHub
from ..stream.policy import WINDOW, CommitPolicy, Decision, PolicyConfig
from ..stream.timeline import SR, AudioTimeline

POLICIES = {
    "interactive": PolicyConfig(step_s=0.5, eou_silence_s=0.3, max_utterance_s=6.0),
    "standard": PolicyConfig(step_s=1.0, eou_silence_s=0.4, max_utterance_s=10.0),
    "batch": PolicyConfig(step_s=3.0, eou_silence_s=0.6, max_utterance_s=15.0),
}


BACKLOG_AFTER_CLOSE_S = 60.0  # how long unlogged finals are still written after their stream closed
INPUTS = ("audio", "image", "text")  # what a stream may send; a stream declares a subset in its start message
LOW_FRAME_INTERVAL_S = 5.0  # breaker step "lower_frame_rate": image frames read at most this often per stream


class State(enum.IntEnum):
    OPENING = 0
    LIVE = 1
    DRAINING = 2
    CLOSED = 3


@dataclass
class StreamSpec:
    source_lang: str
    targets: list[str]
    slo: str = "standard"
    importance: float = 0.5
    partials: bool = True
    glossary: list[Term] = field(default_factory=list)
    min_confidence: float = 0.4
    speech: bool = False
    audio_format: str = "pcm16"  # or "webm" / "ogg" (Opus, as MediaRecorder sends it)
    # seconds added to a modality's media timestamps to bring it onto the audio clock (camera / slide skew)
    clock_offsets: dict[str, float] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=lambda: list(INPUTS))  # no audio: no speech capacity reserved
    stream_id: str = field(default_factory=lambda: "st_" + secrets.token_hex(8))
    resume_token: str = field(default_factory=lambda: secrets.token_urlsafe(16))


def spec_to_dict(spec: StreamSpec) -> dict[str, Any]:
    return {"source_lang": spec.source_lang, "targets": spec.targets, "slo": spec.slo, "importance": spec.importance,
            "partials": spec.partials, "glossary": [[t.source, t.target] for t in spec.glossary],
            "min_confidence": spec.min_confidence, "speech": spec.speech, "audio_format": spec.audio_format,
            "clock_offsets": spec.clock_offsets, "inputs": spec.inputs}


def spec_from_dict(d: dict[str, Any], stream_id: str, resume_token: str) -> StreamSpec:
    return StreamSpec(source_lang=d["source_lang"], targets=list(d["targets"]), slo=d["slo"],
                      importance=float(d["importance"]), partials=bool(d["partials"]),
                      glossary=[Term(s, t) for s, t in d.get("glossary", [])],
                      min_confidence=float(d["min_confidence"]), speech=bool(d["speech"]),
                      audio_format=d.get("audio_format", "pcm16"), clock_offsets=dict(d.get("clock_offsets", {})),
                      inputs=list(d.get("inputs", INPUTS)),
                      stream_id=stream_id, resume_token=resume_token)


class SlowConsumer(LinguaFusionError):
    status = 429
    code = "slow_consumer"


class Draining(LinguaFusionError):
    status = 503
    code = "draining"
    retryable = True


class StreamSession:
    def __init__(self, hub: StreamHub, spec: StreamSpec, *, max_events: int = 256,
                 resume: dict[str, Any] | None = None) -> None:
        self.hub = hub
        self.spec = spec
        self.store = getattr(hub, "store", None)  # write-ahead log of finals (None: not crash-safe)
        self._resume = resume  # the stored snapshot when this session continues a stream after a restart
        self.state = State.OPENING
        self.timeline = AudioTimeline()
        self.policy = CommitPolicy(POLICIES[spec.slo])
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=max_events)
        self._jobs: asyncio.Queue[asyncio.Task[dict[str, Any] | None] | None] = asyncio.Queue(maxsize=64)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._partial: asyncio.Task[None] | None = None
        self._vad_pos = 0  # next sample the VAD has not seen
        self._utterance = 0
        self._last_partial = ""
        self._revision = 0
        self.seq = 0
        self.slides: list[tuple[float, str]] = []
        self._arrivals: deque[tuple[float, float]] = deque(maxlen=4096)  # (stream time end, wall clock)
        self._emitter: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: LinguaFusionError | None = None
        self._decoder: StreamDecoder | None = None
        self._pump: asyncio.Task[None] | None = None
        self._opened = False
        self._last_frame_t = -1e9
        self.frames_dropped = 0  # image frames not read because the class was degraded
        # finals sent while the stream log was unavailable, oldest first, written when it answers again
        self._unlogged: deque[dict[str, Any]] = deque()
        self._backfill: asyncio.Task[None] | None = None
        self._logged_seq = 0
        self._log_progress = asyncio.Condition()
        self._outage = False  # a not_durable notice went out and no durable one yet
        self._closed_at: float | None = None
        self._text_until = -1.0  # a resumed stream: re-sent text at or before this stream time was logged already
        self.max_unlogged = 1000

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _to(self, state: State) -> None:
        if state < self.state:
            raise RuntimeError(f"illegal transition {self.state.name} -> {state.name}")
        self.state = state

    async def open(self) -> dict[str, Any]:
        """Record the new stream in the stream log (off the event loop), then go live: the ``ready`` event."""
        if self._resume is None and self.store is not None:
            from ..stream.storelink import STORE_WAIT_S

            await self._store_call("open_stream", self.spec.stream_id, self.spec.resume_token,
                                   {"spec": spec_to_dict(self.spec)}, wait_s=STORE_WAIT_S)
            self._opened = True
        return self.start()

    async def _store_call(self, method: str, *args: Any, wait_s: float | None = None) -> Any:
        link = getattr(self.hub, "link", None)
        if link is not None:
            return await link.call(method, *args, wait_s=wait_s)
        return await asyncio.to_thread(getattr(self.store, method), *args)

    def start(self) -> dict[str, Any]:
        """Go live. Returns the ``ready`` event (with what a resuming client needs to re-send)."""
        extra: dict[str, Any] = {}
        if self._resume is not None:
            snap = self._resume
            self.seq = self._logged_seq = int(snap.get("last_seq", 0))
            self._text_until = float(snap.get("text_until", -1.0))
            until = float(snap.get("committed_until", 0.0))
            origin = snap.get("origin")
            if origin is not None:
                self.timeline.origin = float(origin)
            self.timeline.start = self.timeline.end = int(round(until * SR))
            self._vad_pos = self.timeline.start
            self.policy.committed(until)
            extra = {"resumed": True, "last_seq": self.seq, "resume_from": round(until, 3),
                     "resume_from_ts": round(until + float(origin), 3) if origin is not None else None}
        elif self.store is not None and not self._opened:
            self.store.open_stream(self.spec.stream_id, self.spec.resume_token, {"spec": spec_to_dict(self.spec)})
        self._to(State.LIVE)
        self._emitter = asyncio.create_task(self._emit_finals(), name=f"emit:{self.spec.stream_id}")
        if self.spec.audio_format != "pcm16":
            loop = asyncio.get_running_loop()
            decoded: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)

            def sink(item: Any) -> None:  # on the decoder thread: blocks while the stream is behind
                asyncio.run_coroutine_threadsafe(decoded.put(item), loop).result(timeout=120)

            self._decoder = StreamDecoder(self.spec.audio_format, sink)
            self._pump = self._spawn(self._pump_decoded(decoded), "decode-pump")
        return {"type": "ready", "stream_id": self.spec.stream_id, "resume_token": self.spec.resume_token,
                "slo": self.spec.slo, "source_lang": self.spec.source_lang, "targets": self.spec.targets,
                "partials": self.spec.partials, **extra}

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _emit(self, event: dict[str, Any]) -> None:
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self.error = SlowConsumer("the client is not reading events; the stream was closed")
            await self.abort()

    # ---- input -----------------------------------------------------------------------------------------------
    async def feed_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        """PCM16 LE mono 16 kHz bytes, or a piece of the WebM/Ogg stream when the stream declared one."""
        if self.state != State.LIVE:
            raise InvalidParameter("the stream is not live")
        self._declared("audio")
        if self._decoder is not None:
            await asyncio.to_thread(self._decoder.feed, pcm16)
            return
        if len(pcm16) % 2:
            raise InvalidParameter("PCM16 audio must have an even number of bytes")
        await self._ingest(np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0, ts)

    async def _pump_decoded(self, decoded: asyncio.Queue[Any]) -> None:
        while True:
            item = await decoded.get()
            if item is None:
                return
            if isinstance(item, LinguaFusionError):
                await self._emit({"type": "error", "code": item.code, "message": item.message})
                continue
            await self._ingest(item, None)

    async def _ingest(self, samples: np.ndarray, ts: float | None) -> None:
        if not self.timeline.write(samples, ts):
            return
        self._arrivals.append((self.timeline.end_s, time.monotonic()))
        await self._run_vad()

    async def _run_vad(self) -> None:
        end = self.timeline.end
        start = max(self._vad_pos, self.timeline.start)
        n = (end - start) // WINDOW
        if n <= 0:
            return
        audio = self.timeline.view(start / SR, (start + n * WINDOW) / SR)
        probs = self.hub.vad_probs(np.ascontiguousarray(audio))
        self._vad_pos = start + n * WINDOW
        for d in self.policy.on_vad(probs, self._vad_pos / SR):
            self._decide(d)

    def _decide(self, d: Decision) -> None:
        if d.kind == "partial" and self.spec.partials and not self._degraded("drop_partials") and (
                self._partial is None or self._partial.done()):
            audio = self.timeline.view(d.start, d.end).copy()
            self._partial = self._spawn(self._partial_job(audio, d, self._utterance), "partial")
        elif d.kind == "commit":
            audio = self.timeline.view(d.start, d.end).copy()
            self._queue_job(self._commit_job(audio, d))
            self._utterance += 1
            self._last_partial = ""
            self.timeline.consume_s(d.end)

    def _queue_job(self, coro: Any) -> None:
        task = self._spawn(coro, "commit")
        try:
            self._jobs.put_nowait(task)
        except asyncio.QueueFull:
            task.cancel()
            self.error = SlowConsumer("too many captions pending; the stream was closed")
            self._spawn(self.abort(), "abort")

    def _place(self, modality: str, ts: float | None) -> float:
        """Stream time of a non-audio item: its media timestamp, corrected for that modality's clock skew. The
        first timestamped item of any modality fixes the stream's clock origin (a text-only stream has no audio)."""
        if ts is None:
            return self.timeline.end_s
        if self.timeline.origin is None:
            self.timeline.origin = ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.end_s
        return max(0.0, ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.origin)

    async def feed_text(self, text: str, ts: float | None = None) -> None:
        if self.state != State.LIVE:
            raise InvalidParameter("the stream is not live")
        self._declared("text")
        t = self._place("text", ts)
        if ts is not None and t <= self._text_until + 1e-6:
            return  # re-sent after a resume, and its caption was logged before the break: not again
        self._queue_job(self._translate_job(text.strip(), t, t, confidence=1.0, wall_ref=time.monotonic(),
                                            modality="text"))

    async def feed_image(self, data: bytes, ts: float | None = None) -> None:
        from ..media import decode_image

        self._declared("image")
        image = decode_image(data, self.hub.settings.limits)
        if self._degraded("skip_vision"):
            self.frames_dropped += 1
            return  # degraded: slides are not read while the class is over its SLO
        t = self._place("image", ts)
        if self._degraded("lower_frame_rate") and t - self._last_frame_t < LOW_FRAME_INTERVAL_S:
            self.frames_dropped += 1
            return  # degraded: at most one frame read per LOW_FRAME_INTERVAL_S of stream time
        self._last_frame_t = t
        self._spawn(self._ocr_job(image, t), "ocr")

    async def end(self) -> None:
        """The client finished sending: flush pending speech, let every committed caption out, then close."""
        if self.state != State.LIVE:
            return
        self._to(State.DRAINING)
        if self._decoder is not None and self._pump is not None:
            self._decoder.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=60)
        flush = self.policy.flush(self.timeline.end_s)
        self._decide(flush)
        if flush.kind == "commit":
            self.policy.committed(flush.end)
        await self._jobs.put(None)

    def _declared(self, kind: str) -> None:
        if kind not in self.spec.inputs:
            raise InvalidParameter(f"this stream declared inputs {self.spec.inputs}: {kind} was not among them")

    def _degraded(self, step: str) -> bool:
        breaker = getattr(self.hub, "breaker", None)
        return breaker is not None and breaker.active(self.spec.slo, step)

    async def notify(self, event: dict[str, Any]) -> None:
        if self.state in (State.LIVE, State.DRAINING):
            await self._emit(event)

    async def shed(self, message: str) -> None:
        from ..errors import Overloaded

        self.error = Overloaded(message, retry_after=10.0)
        await self.abort()

    async def drain(self, deadline_s: float) -> None:
        """Server shutdown: let queued commits finish (they are logged and sent) within ``deadline_s``, then close
        with ``draining`` so the client reconnects elsewhere (or to the restarted server) and re-sends the rest."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while loop.time() < end and (self._jobs.qsize() or self._unlogged or any(
                t.get_name() == "commit" and not t.done() for t in self._tasks)):
            await asyncio.sleep(0.05)
        self.error = Draining("the server is shutting down; reconnect to resume this stream")
        await self.abort()

    async def abort(self) -> None:
        if self.state == State.CLOSED:
            return
        self.state = State.CLOSED
        keep = self._backfill if self._unlogged and self._backfill is not None and not self._backfill.done() else None
        for task in list(self._tasks):
            if task is not keep:
                task.cancel()
        if keep is not None:
            # finals already sent and not yet logged: their writer goes on (a connection drop is not a reason to
            # lose them) until they are written or BACKLOG_AFTER_CLOSE_S pass; the hub owns it from here
            self._closed_at = time.monotonic()
            adopt = getattr(self.hub, "adopt_backlog", None)
            if adopt is not None:
                adopt(self.spec.stream_id, keep)
        if self._decoder is not None:
            self._decoder.close()
        if self._emitter is not None and self._emitter is not asyncio.current_task():
            self._emitter.cancel()
        self.hub.release(self.spec.stream_id)
        self.closed.set()

    # ---- jobs --------------------------------------------------------------------------------------------------
    def _slide_terms(self, text: str) -> list[Term]:
        """Names on recent slides (acronyms, capitalised words inside a line) that this utterance says: MT keeps
        them as written instead of translating or re-spelling them (Apertium turns "Acme" into "Acmé")."""
        names: set[str] = set()
        for _t, slide in self.slides[-5:]:
            for line in slide.split("  ") if "  " in slide else [slide]:
                words = re.findall(r"[A-Za-z][A-Za-z0-9]+", line)
                for i, w in enumerate(words):
                    if (w.isupper() and len(w) > 1) or any(c.isdigit() for c in w) or (i > 0 and w[0].isupper()):
                        names.add(w)
        own = {t.source.lower() for t in self.spec.glossary}
        return [Term(n, n) for n in sorted(names) if n.lower() not in own and re.search(rf"\b{re.escape(n)}\b", text)]

    def _prompt(self) -> str | None:
        """Words on the current slide, as ASR context (hot words)."""
        return self.slides[-1][1][:200] if self.slides else None

    async def _partial_job(self, audio: np.ndarray, d: Decision, utterance: int) -> None:
        with contextlib.suppress(BackendError):  # tentative: a failed re-decode is just a partial not shown
            await self._partial_decode(audio, d, utterance)

    async def _partial_decode(self, audio: np.ndarray, d: Decision, utterance: int) -> None:
        res = await self.hub.call(self.hub.asr_key(self.spec.source_lang), (audio, self._prompt()),
                                  stream_id=self.spec.stream_id, slo=self.spec.slo, stage="asr",
                                  importance=self.spec.importance, tentative=True)
        if res is None or utterance != self._utterance or self.state != State.LIVE:
            return
        text, conf = res
        stable = self.policy.stable(text.split())
        translation = text
        target = self.spec.targets[0]
        if text and target != self.spec.source_lang:
            # a tentative translation of the tentative text: shed first under load, like the re-decode itself
            out = await self.hub.call(f"mt:{self.spec.source_lang}-{target}", (text, self.spec.glossary),
                                      stream_id=self.spec.stream_id, slo=self.spec.slo, stage="mt",
                                      importance=self.spec.importance, tentative=True)
            if out is None or utterance != self._utterance or self.state != State.LIVE:
                return
            translation = str(out)
        kind = "partial"
        if self._last_partial and not text.startswith(self._last_partial):
            kind = "revision"
            self._revision += 1
        self._last_partial = text
        await self._emit({"type": kind, "start": round(d.start, 3), "end": round(d.end, 3), "source_text": text,
                          "stable_text": " ".join(stable), "text": translation, "confidence": conf,
                          "revision": self._revision})

    async def _commit_job(self, audio: np.ndarray, d: Decision) -> dict[str, Any] | None:
        wall_ref = self._arrival_of(d.end)
        try:
            res = await self.hub.call(self.hub.asr_key(self.spec.source_lang), (audio, self._prompt()),
                                      stream_id=self.spec.stream_id, slo=self.spec.slo, stage="asr",
                                      importance=self.spec.importance, tentative=False, start=wall_ref)
        except BackendError as exc:
            # retried and still failing: the span gets a final that says so, keeping the numbering gap-free
            return {"type": "final", "start": round(d.start, 3), "end": round(d.end, 3), "source_text": "",
                    "text": "", "translations": {t: "" for t in self.spec.targets}, "confidence": 0.0,
                    "failed": ["asr"], "note": f"speech recognition failed: {exc.message}", "_wall_ref": wall_ref}
        if res is None:
            return None
        text, conf = res
        asr_ms = (time.monotonic() - wall_ref) * 1000
        if not text.strip():
            return None
        if conf < self.spec.min_confidence:
            return {"type": "final", "start": round(d.start, 3), "end": round(d.end, 3), "source_text": "",
                    "text": "", "translations": {t: "" for t in self.spec.targets}, "confidence": conf,
                    "gated": ["asr"], "note": f"speech confidence {conf:.2f} below {self.spec.min_confidence}",
                    "_wall_ref": wall_ref}
        return await self._translate_job(text, d.start, d.end, confidence=conf, wall_ref=wall_ref, asr_ms=asr_ms)

    async def _translate_job(self, text: str, start: float, end: float, *, confidence: float, wall_ref: float,
                             asr_ms: float = 0.0, modality: str = "audio") -> dict[str, Any] | None:
        if not text:
            return None
        src = self.spec.source_lang
        t0 = time.monotonic()

        slide_terms = self._slide_terms(text)
        terms = self.spec.glossary + slide_terms
        failed: list[str] = []
        notes: list[str] = []

        async def one(target: str) -> str:
            if target == src:
                return text
            try:
                out = await self.hub.call(f"mt:{src}-{target}", (text, terms),
                                          stream_id=self.spec.stream_id, slo=self.spec.slo, stage="mt",
                                          importance=self.spec.importance, tentative=False, start=wall_ref)
            except BackendError as exc:  # retried and still failing: the source text stays, the target is empty
                failed.append(f"mt:{target}")
                notes.append(f"translation to {target} failed: {exc.message}")
                return ""
            return str(out or "")

        outs = await asyncio.gather(*(one(t) for t in self.spec.targets))
        translations = dict(zip(self.spec.targets, outs, strict=True))
        slides = [s for t, s in self.slides if start - 0.5 <= t <= end] or ([self.slides[-1][1]] if self.slides else [])
        event = {"type": "final", "start": round(start, 3), "end": round(end, 3), "source_text": text,
                 "text": translations[self.spec.targets[0]], "translations": translations,
                 "confidence": confidence, "slides": slides, "slide_terms": [t.source for t in slide_terms],
                 "latency_ms": {"asr": round(asr_ms, 1), "mt": round((time.monotonic() - t0) * 1000, 1)},
                 "_wall_ref": wall_ref, "_modality": modality}
        if failed:
            event["failed"] = sorted(failed)
            event["note"] = "; ".join(notes)
        return event

    async def _ocr_job(self, image: np.ndarray, t: float) -> None:
        try:
            lines = await self.hub.call("ocr", image, stream_id=self.spec.stream_id, slo=self.spec.slo, stage="ocr",
                                        importance=self.spec.importance, tentative=True)
        except BackendError as exc:
            await self._emit({"type": "error", "code": exc.code, "message": f"slide not read: {exc.message}"})
            return
        if lines:
            text = " ".join(ln.text for ln in lines)
            self.slides.append((t, text))
            del self.slides[:-32]
            await self._emit({"type": "slide", "t": round(t, 3), "source_text": text})

    def _arrival_of(self, t: float) -> float:
        for end, wall in self._arrivals:
            if end >= t - 1e-3:
                return wall
        return time.monotonic()

    async def _emit_finals(self) -> None:
        try:
            while True:
                job = await self._jobs.get()
                if job is None:
                    break
                try:
                    event = await job
                except LinguaFusionError as exc:
                    await self._emit({"type": "error", "code": exc.code, "message": exc.message})
                    continue
                if event is None:
                    continue
                wall_ref = event.pop("_wall_ref")
                modality = event.pop("_modality", "audio")
                self.seq += 1
                event["seq"] = self.seq
                await self._log(event, modality)
                latency = time.monotonic() - wall_ref
                event.setdefault("latency_ms", {})["caption"] = round(latency * 1000, 1)
                if self.hub.metrics is not None:
                    self.hub.metrics.caption(self.spec.slo, latency)
                breaker = getattr(self.hub, "caption_latency", None)
                if breaker is not None:
                    await breaker(self.spec.slo, latency)
                await self._emit(event)
                await self._emit({"type": "metrics", "seq": self.seq, "latency_ms": event["latency_ms"],
                                  "queue_depth": {k: self.hub.scheduler.depth(k) for k in self.hub.keys_for(self)}})
                if self.spec.speech and event["text"]:
                    try:
                        await self._speech(event)
                    except LinguaFusionError as exc:
                        await self._emit({"type": "error", "code": exc.code,
                                          "message": f"speech for caption {event['seq']} failed: {exc.message}"})
            unlogged = await self._flush_unlogged(self.hub.settings.server.drain_timeout_s)
            if self.store is not None and not unlogged:
                with contextlib.suppress(LinguaFusionError):
                    await self._store_call("close_stream", self.spec.stream_id)
            await self._emit({"type": "closed", "reason": "end of stream", "finals": self.seq,
                              **({"unlogged": unlogged} if unlogged else {}),
                              "frames_dropped": self.frames_dropped,
                              "timeline": {"late_dropped": self.timeline.stats.late_dropped,
                                           "reordered": self.timeline.stats.reordered,
                                           "gap_seconds": round(self.timeline.stats.gap_seconds, 3)}})
        finally:
            self.state = State.CLOSED
            self.hub.release(self.spec.stream_id)
            self.closed.set()

    async def _log(self, event: dict[str, Any], modality: str = "audio") -> None:
        """Write a final to the write-ahead log before it is sent. Writes go through one ordered queue per stream
        (the log stays in seq order); a final waits for its write at most ``state.log_wait_s``. While the log is
        down or slow (Redis killed, slow, cut off) captions keep flowing: a final that could not wait goes out
        marked ``durable: false`` (after a ``not_durable`` notice), stays queued (bounded) and is written when the
        store answers; a ``durable`` event then says up to which seq everything is logged."""
        if self.store is None:
            return
        if len(self._unlogged) >= self.max_unlogged:
            event["durable"] = False
            self.error = BackendError("the stream log has been unavailable too long; the stream was closed")
            await self.abort()
            return
        seq = int(event["seq"])
        self._unlogged.append({**event, "_origin": self.timeline.origin, "_modality": modality})
        if self.hub.metrics is not None:
            self.hub.metrics.unlogged_finals.inc()
        if self._backfill is None or self._backfill.done():
            self._backfill = self._spawn(self._write_backlog(), "backfill")
        link = getattr(self.hub, "link", None)
        wait = self.hub.settings.state.log_wait_s if link is None or link.ready() else 0.0
        try:
            async with self._log_progress:
                await asyncio.wait_for(self._log_progress.wait_for(lambda: self._logged_seq >= seq), wait)
            return
        except TimeoutError:
            if self._logged_seq >= seq:
                return  # written just as the wait ran out
        event["durable"] = False
        if not self._outage:
            self._outage = True
            why = link.last_error if link is not None and link.last_error else "the write is slow"
            await self._emit({"type": "not_durable", "from_seq": seq, "code": "state_store_unavailable",
                              "message": f"captions from {seq} on are sent before they are crash-safe ({why}); "
                                         "a durable event follows when they are"})

    async def _write_backlog(self) -> None:
        from ..errors import ClientError

        link = getattr(self.hub, "link", None)
        while self._unlogged:
            if self._closed_at is not None and time.monotonic() - self._closed_at > BACKLOG_AFTER_CLOSE_S:
                return  # the stream is gone and the log still does not answer: give up (counted as unlogged)
            if link is not None and not link.ready():
                await asyncio.sleep(min(1.0, max(0.05, link.down_until - link.clock())))
                continue
            event = self._unlogged[0]
            body = {k: v for k, v in event.items() if k not in ("_origin", "_modality")}
            end = float(body["end"])
            audio = event["_modality"] == "audio"
            try:
                await self._store_call("append_final", self.spec.stream_id, body, end if audio else None,
                                       event["_origin"], None if audio else end)
            except ClientError as exc:  # the store answered: this stream is gone from it (compacted, Redis lost it)
                self._unlogged.clear()
                if self.state != State.CLOSED:
                    await self._emit({"type": "error", "code": exc.code,
                                      "message": f"the stream log lost this stream: {exc.message}"})
                return
            except LinguaFusionError:
                await asyncio.sleep(0.5 if link is None else 0.05)
                continue
            self._unlogged.popleft()
            if self.hub.metrics is not None:
                self.hub.metrics.unlogged_finals.dec()
            async with self._log_progress:
                self._logged_seq = int(body["seq"])
                self._log_progress.notify_all()
            if not self._unlogged and self._outage and self.state != State.CLOSED:
                self._outage = False
                await self._emit({"type": "durable", "through_seq": self._logged_seq})

    async def _flush_unlogged(self, timeout: float) -> int:
        """At the end of a stream: give the backlog ``timeout`` seconds to reach the log; returns what is left."""
        if self._backfill is not None and not self._backfill.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._backfill), timeout)
        return len(self._unlogged)

    async def _speech(self, event: dict[str, Any]) -> None:
        target = self.spec.targets[0]
        wav = await self.hub.call(f"tts:{target}", event["text"], stream_id=self.spec.stream_id, slo=self.spec.slo,
                                  stage="tts", importance=self.spec.importance, tentative=False)
        if wav:
            await self._emit({"type": "speech", "seq": event["seq"], "lang": target, "format": "wav",
                              "audio_base64": base64.b64encode(wav).decode("ascii")})

    async def wait_closed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)
