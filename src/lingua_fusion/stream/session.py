"""One live stream: its timeline, commit decisions, ordered finals and bounded event queue.

Its face is three verbs and a queue: ``feed_audio`` / ``feed_image`` / ``feed_text``, ``end``, and ``events``.
Everything else (opening, resuming, admission, the breaker's notices, shedding, drain) is the StreamService's.

Input (audio / image / text with media timestamps) -> timeline -> VAD (off the event loop, batched with other
streams) -> policy decisions. A partial decode is tentative (at most one in flight; the scheduler may shed it). A
commit becomes a job (stream/jobs.py) queued in order; the emitter awaits jobs in that order, numbers finals 1, 2,
3, ... with no gaps, logs each (stream/journal.py) and then sends it. Events go to a bounded queue: a client that
stops reading gets a clear close instead of unbounded buffering.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from ..config import Settings
from ..errors import (
    BackendError,
    InvalidParameter,
    LinguaFusionError,
    Overloaded,
    SlowConsumer,
    StoreUnavailable,
    TooLarge,
)
from ..media.stream_decoder import StreamDecoder
from ..serving.ports import ModelPort
from ..tracing import TraceRef, span
from ..types import SR
from .events import Closed, Error, Event, Final, Metrics, Partial, Ready, Revision, Slide, Speech, error_event
from .jobs import StreamJobs
from .journal import Journal, StreamLog
from .policy import WINDOW, CommitPolicy, Decision
from .protocol import StreamSpec, check_ts
from .timeline import AudioTimeline

LOW_FRAME_INTERVAL_S = 5.0  # breaker step "lower_frame_rate": image frames read at most this often per stream
MAX_IMAGES_IN_FLIGHT = 2  # frames a stream may have decoding or waiting for OCR at once; more are refused


class Slots:
    """A count of things in flight with a bound, shared by the streams of a service (decoded images: a key's 32
    streams must not hold 64 decoded 40-megapixel frames at once)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(0, self.used - 1)


class State(enum.IntEnum):
    OPENING = 0
    LIVE = 1
    DRAINING = 2
    CLOSED = 3


class StreamOwner(Protocol):
    """What a session needs from the service that owns it."""

    vision: Any  # vision/service.py VisionService, or None: read only by streams started with a vocabulary_id

    def degraded(self, slo: str, step: str) -> bool:
        """Is the breaker's ``step`` active for this SLO class now?"""
        ...

    def caption_done(self, slo: str, seconds: float) -> None:
        """A final went out ``seconds`` after its words arrived."""
        ...

    def released(self, session: StreamSession) -> None:
        """The session closed: free what it held."""
        ...


class StreamSession:
    def __init__(self, spec: StreamSpec, port: ModelPort, owner: StreamOwner, settings: Settings, *,
                 log: StreamLog | None = None, max_events: int = 256, resume: dict[str, Any] | None = None,
                 image_slots: Slots | None = None, trace: TraceRef | None = None) -> None:
        self.spec = spec
        self.owner = owner
        self.settings = settings
        self._resume = resume  # the stored snapshot when this session continues a stream after a restart
        self.state = State.OPENING
        self.timeline = AudioTimeline()
        self.policy = CommitPolicy(spec.policy)
        self.trace = trace  # the stream's span (tracing on; the StreamService ends it): stages are its children
        self.jobs = StreamJobs(spec, port, trace)
        self.events: asyncio.Queue[Event] = asyncio.Queue(maxsize=max_events)
        self.journal = Journal(log, spec.stream_id, self._emit, wait_s=settings.state.log_wait_s) \
            if log is not None else None
        self._pending: asyncio.Queue[asyncio.Task[Final | None] | None] = asyncio.Queue(maxsize=64)
        self._tasks: set[asyncio.Task[Any]] = set()
        # sees every event the session emits, first (a room's publisher: rooms/publisher.py); must never block
        self.tap: Callable[[Event], None] | None = None
        self._partial: asyncio.Task[None] | None = None
        self._vad_lock = asyncio.Lock()
        self._vad_pos = 0  # next sample the VAD has not seen
        self._utterance = 0
        self._last_partial = ""
        self._revision = 0
        self.seq = 0
        self._arrivals: deque[tuple[float, float]] = deque(maxlen=4096)  # (stream time end, wall clock)
        self._emitter: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: LinguaFusionError | None = None
        self._decoder: StreamDecoder | None = None
        self._pump: asyncio.Task[None] | None = None
        self._last_frame_t = -1e9
        self._images = 0  # frames decoding or waiting for OCR
        self.image_slots = image_slots or Slots(MAX_IMAGES_IN_FLIGHT)  # the same, across the service's streams
        self.frames_dropped = 0  # image frames not read because the class was degraded
        self.video: Any = None  # video/stream_slides.py StreamVideo, made by the first ``frame`` message
        self._last_video_t = -1e9
        self._text_until = -1.0  # a resumed stream: re-sent text at or before this stream time was logged already

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _to(self, state: State) -> None:
        if state < self.state:
            raise RuntimeError(f"illegal transition {self.state.name} -> {state.name}")
        self.state = state

    async def open(self) -> Ready:
        """Record a new stream in the stream log (off the event loop), then go live."""
        if self._resume is None and self.journal is not None:
            await self.journal.open(self.spec.resume_token, self.spec.to_dict())
        return self.start()

    def start(self) -> Ready:
        """Go live. Returns the ``ready`` event (with what a resuming client needs to re-send)."""
        resumed: dict[str, Any] | None = None
        if self._resume is not None:
            snap = self._resume
            self.seq = int(snap.get("last_seq", 0))
            if self.journal is not None:
                self.journal.logged_seq = self.seq
            self._text_until = float(snap.get("text_until", -1.0))
            until = float(snap.get("committed_until", 0.0))
            origin = snap.get("origin")
            if origin is not None:
                self.timeline.origin = float(origin)
            self.timeline.start = self.timeline.end = int(round(until * SR))
            self._vad_pos = self.timeline.start
            self.policy.committed(until)
            resumed = {"last_seq": self.seq, "resume_from": round(until, 3),
                       "resume_from_ts": round(until + float(origin), 3) if origin is not None else None}
        self._to(State.LIVE)
        self._emitter = asyncio.create_task(self._emit_finals(), name=f"emit:{self.spec.stream_id}")
        if self.spec.audio_format != "pcm16":
            self._start_decoder()
        return Ready(stream_id=self.spec.stream_id, resume_token=self.spec.resume_token, slo=self.spec.slo,
                     source_lang=self.spec.source_lang, targets=self.spec.targets, partials=self.spec.partials,
                     resumed=resumed)

    def _start_decoder(self) -> None:
        loop = asyncio.get_running_loop()
        decoded: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)

        def sink(item: Any) -> None:  # on the decoder thread: blocks while the stream is behind
            asyncio.run_coroutine_threadsafe(decoded.put(item), loop).result(timeout=120)

        self._decoder = StreamDecoder(self.spec.audio_format, sink)
        self._pump = self._spawn(self._pump_decoded(decoded), "decode-pump")

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _emit(self, event: Event) -> None:
        if self.tap is not None:
            self.tap(event)
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self.fail(SlowConsumer("the client is not reading events; the stream was closed"))

    async def outgoing(self) -> AsyncIterator[Event]:
        """What the client is sent, in order, until the stream ends: every queued event through ``closed``; a
        session that ended without one (slow consumer, shed, drain) gives what was queued, then the error saying
        why. The WebSocket writer and in-process streams both read this."""
        while True:
            get = asyncio.ensure_future(self.events.get())
            closed = asyncio.ensure_future(self.closed.wait())
            done, _ = await asyncio.wait({get, closed}, return_when=asyncio.FIRST_COMPLETED)
            if get in done:
                closed.cancel()
                event = get.result()
                yield event
                if event.TYPE == "closed":
                    return
                continue
            get.cancel()
            while not self.events.empty():
                yield self.events.get_nowait()
            if self.error is not None:
                yield error_event(self.error)
            return

    def notify(self, event: Event) -> None:
        """An event from outside the stream (a breaker notice, one bad message): sent while the stream is open."""
        if self.state in (State.LIVE, State.DRAINING):
            self._emit(event)

    # ---- input -----------------------------------------------------------------------------------------------
    def _live(self, kind: str) -> None:
        if self.state != State.LIVE:
            raise InvalidParameter("the stream is not live")
        if kind not in self.spec.inputs:
            raise InvalidParameter(f"this stream declared inputs {self.spec.inputs}: {kind} was not among them")

    async def feed_audio(self, pcm16: bytes, ts: float | None = None) -> None:
        """PCM16 LE mono 16 kHz bytes, or a piece of the WebM/Ogg stream when the stream declared one."""
        self._live("audio")
        ts = check_ts(ts)
        if self._decoder is not None:
            with span(self.trace, "decode", media=self.spec.audio_format, bytes=len(pcm16)):
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
                self._emit(Error(item.code, item.public_message))
                continue
            await self._ingest(item, None)

    async def _ingest(self, samples: np.ndarray, ts: float | None) -> None:
        if not self.timeline.write(samples, ts):
            return
        self._arrivals.append((self.timeline.end_s, time.monotonic()))
        async with self._vad_lock:  # windows in order, each seen once
            end = self.timeline.end
            start = max(self._vad_pos, self.timeline.start)
            n = (end - start) // WINDOW
            if n <= 0:
                return
            probs = await self.jobs.vad(self.timeline.view(start / SR, (start + n * WINDOW) / SR))
            self._vad_pos = start + n * WINDOW
            if self.state == State.CLOSED:
                return
            for d in self.policy.on_vad(probs, self._vad_pos / SR):
                self._decide(d)

    def _decide(self, d: Decision) -> None:
        if d.kind == "partial" and self.spec.partials and not self.owner.degraded(self.spec.slo, "drop_partials") \
                and (self._partial is None or self._partial.done()):
            audio = self.timeline.view(d.start, d.end).copy()
            self._partial = self._spawn(self._partial_job(audio, d, self._utterance), "partial")
        elif d.kind == "commit":
            audio = self.timeline.view(d.start, d.end).copy()
            self._queue(self.jobs.commit(audio, d.start, d.end, self._arrival_of(d.end)))
            self._utterance += 1
            self._last_partial = ""
            self.timeline.consume_s(d.end)

    def _queue(self, job: Coroutine[Any, Any, Final | None]) -> None:
        task = self._spawn(job, "commit")
        try:
            self._pending.put_nowait(task)
        except asyncio.QueueFull:
            task.cancel()
            self.fail(SlowConsumer("too many captions pending; the stream was closed"))

    def _place(self, modality: str, ts: float | None) -> float:
        """Stream time of a non-audio item: its media timestamp, corrected for that modality's clock skew. The
        first timestamped item of any modality fixes the stream's clock origin (a text-only stream has no audio)."""
        if ts is None:
            return self.timeline.end_s
        if self.timeline.origin is None:
            self.timeline.origin = ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.end_s
        return max(0.0, ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.origin)

    async def feed_text(self, text: str, ts: float | None = None) -> None:
        self._live("text")
        ts = check_ts(ts)
        limit = self.settings.limits.max_text_chars
        if len(text) > limit:  # as on REST: one message cannot hold a model worker for seconds
            raise TooLarge(f"a text message has at most {limit} characters (this one {len(text)}); split it",
                           details={"limit": "max_text_chars"})
        t = self._place("text", ts)
        if ts is not None and t <= self._text_until + 1e-6:
            return  # re-sent after a resume, and its caption was logged before the break: not again
        self._queue(self.jobs.translate(text.strip(), t, t, confidence=1.0, wall_ref=time.monotonic(),
                                        modality="text"))

    async def feed_image(self, data: bytes, ts: float | None = None) -> None:
        from ..media import decode_image

        self._live("image")
        ts = check_ts(ts)
        if self.owner.degraded(self.spec.slo, "skip_vision"):
            self.frames_dropped += 1
            return  # degraded: slides are not read while the class is over its SLO
        t = self._place("image", ts)
        if self.owner.degraded(self.spec.slo, "lower_frame_rate") and t - self._last_frame_t < LOW_FRAME_INTERVAL_S:
            self.frames_dropped += 1
            return  # degraded: at most one frame read per LOW_FRAME_INTERVAL_S of stream time
        if self._images >= MAX_IMAGES_IN_FLIGHT:
            raise Overloaded(f"more than {MAX_IMAGES_IN_FLIGHT} images of this stream are being read; send fewer",
                             retry_after=1.0)
        if not self.image_slots.take():
            raise Overloaded("the server is reading too many images; send fewer", retry_after=1.0)
        self._images += 1
        try:
            with span(self.trace, "decode", media="image", bytes=len(data)):
                image = await asyncio.to_thread(decode_image, data, self.settings.limits)  # big images: off the loop
        except BaseException:
            self._image_done()
            raise
        self._last_frame_t = t
        # released when the job ends, however it ends (a task cancelled before it starts never runs a finally)
        self._spawn(self._slide_job(image, t), "ocr").add_done_callback(lambda _task: self._image_done())

    async def feed_frame(self, data: bytes, ts: float | None = None) -> None:
        """One video frame (png / jpeg / webp) at media time ``ts``: every frame goes through the slide change
        detector, OCR and MT run only when the picture changed (video/stream_slides.py)."""
        from ..video.stream_slides import StreamVideo

        self._live("video")
        ts = check_ts(ts)
        if ts is None:
            raise InvalidParameter("a frame message needs its media timestamp ts: change detection runs on time")
        if self.owner.degraded(self.spec.slo, "skip_vision"):
            self.frames_dropped += 1
            return
        t = self._place("image", ts)  # a camera's clock: the image clock offset applies
        if self.owner.degraded(self.spec.slo, "lower_frame_rate") and t - self._last_video_t < LOW_FRAME_INTERVAL_S:
            self.frames_dropped += 1
            return
        if self.video is None:
            self.video = StreamVideo(self.jobs, self._emit, self._spawn, lambda: self.state != State.CLOSED,
                                     self.settings.limits, self.image_slots, owner=self)
            if self.spec.vocabulary_id:  # signs (or lips, fused with speech) too, against the key's vocabulary
                from ..vision import stream_signs

                stream_signs.attach(self.video, self.owner.vision, self.spec, self.jobs, self._emit, self._spawn,
                                    queue=self._queue, heard=self._heard)
        self._last_video_t = t
        await self.video.feed(data, t)

    def _heard(self) -> tuple[float, float | None, bool]:
        """For lips (vision/stream_lips.py): audio heard by the VAD until (stream s), the open speech's start."""
        return self._vad_pos / SR, self.policy.speech_start, "audio" in self.spec.inputs

    def _image_done(self) -> None:
        self._images -= 1
        self.image_slots.give()

    async def end(self) -> None:
        """The client finished sending: flush pending speech, let every committed caption out, then close."""
        if self.state != State.LIVE:
            return
        self._to(State.DRAINING)
        if self._decoder is not None and self._pump is not None:
            self._decoder.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=60)
        if self.video is not None:  # the last slide shown, and slides still being read, go out before closed
            await self.video.finish(self.settings.server.drain_timeout_s)
            if self.spec.vocabulary_id:  # and a sign still being made
                from ..vision import stream_signs

                await stream_signs.finish(self.video, self.settings.server.drain_timeout_s)
        flush = self.policy.flush(self.timeline.end_s)
        self._decide(flush)
        if flush.kind == "commit":
            self.policy.committed(flush.end)
        await self._pending.put(None)

    def busy(self) -> bool:
        """Committed work not yet sent or not yet logged (a drain waits for it)."""
        return bool(self._pending.qsize() or (self.journal is not None and self.journal.pending) or any(
            t.get_name() == "commit" and not t.done() for t in self._tasks))

    def fail(self, error: LinguaFusionError) -> None:
        """Close now, saying why (slow consumer, shed, drain, a lost log): the writer sends ``error``."""
        self.error = error
        self.abort()

    def abort(self) -> None:
        """Close now. Queued finals that were already sent but not logged are still written (the journal)."""
        if self.state == State.CLOSED:
            return
        self.state = State.CLOSED
        for task in list(self._tasks):
            task.cancel()
        if self.journal is not None:
            self.journal.detach()
        if self._decoder is not None:
            self._decoder.close()
        if self._emitter is not None and self._emitter is not asyncio.current_task():
            self._emitter.cancel()
        self.owner.released(self)
        self.closed.set()

    # ---- jobs --------------------------------------------------------------------------------------------------
    async def _partial_job(self, audio: np.ndarray, d: Decision, utterance: int) -> None:
        res = await self.jobs.partial(audio, lambda: utterance == self._utterance and self.state == State.LIVE)
        if res is None:
            return
        stable = self.policy.stable(res.text.split())
        kind: type[Partial] = Partial
        if self._last_partial and not res.text.startswith(self._last_partial):
            kind = Revision
            self._revision += 1
        self._last_partial = res.text
        self._emit(kind(start=round(d.start, 3), end=round(d.end, 3), source_text=res.text,
                        stable_text=" ".join(stable), text=res.translation, confidence=res.confidence,
                        revision=self._revision))

    async def _slide_job(self, image: np.ndarray, t: float) -> None:
        try:
            text = await self.jobs.read_slide(image, t)
        except BackendError as exc:
            self._emit(Error(exc.code, f"slide not read: {exc.public_message}"))
            return
        if text:
            self._emit(Slide(t=round(t, 3), source_text=text))

    def _arrival_of(self, t: float) -> float:
        for end, wall in self._arrivals:
            if end >= t - 1e-3:
                return wall
        return time.monotonic()

    async def _emit_finals(self) -> None:
        try:
            while True:
                job = await self._pending.get()
                if job is None:
                    break
                try:
                    final = await job
                except LinguaFusionError as exc:
                    self._emit(Error(exc.code, exc.public_message))
                    continue
                if final is not None:
                    await self._send_final(final)
            unlogged = 0
            if self.journal is not None:
                unlogged = await self.journal.finish(self.settings.server.drain_timeout_s)
            tl = self.timeline.stats
            self._emit(Closed(finals=self.seq, unlogged=unlogged or None, frames_dropped=self.frames_dropped,
                              video=self.video.stats() if self.video is not None else None,
                              timeline={"late_dropped": tl.late_dropped, "reordered": tl.reordered,
                                        "gap_seconds": round(tl.gap_seconds, 3)}))
        finally:
            self.state = State.CLOSED
            self.owner.released(self)
            self.closed.set()

    async def _send_final(self, final: Final) -> None:
        self.seq += 1
        final.seq = self.seq
        if self.journal is not None:
            if self.journal.full:
                final.durable = False
                self.fail(StoreUnavailable("the stream log has been unavailable too long; the stream was closed"))
                return
            with span(self.trace, "journal.write", seq=final.seq) as write:
                await self.journal.append(final, self.timeline.origin)
                if write is not None:
                    write.set(durable=final.durable is not False)  # False: sent before the log had it
        latency = time.monotonic() - final.wall_ref
        final.latency_ms["caption"] = round(latency * 1000, 1)
        self.owner.caption_done(self.spec.slo, latency)
        self._emit(final)
        self._emit(Metrics(seq=self.seq, latency_ms=final.latency_ms,
                           queue_depth={str(k): self.jobs.port.depth(k) for k in self.jobs.model_keys()}))
        if self.spec.speech and final.text:
            await self._speech(final)

    async def _speech(self, final: Final) -> None:
        target = self.spec.targets[0]
        try:
            wav = await self.jobs.speak(final.text, target)
        except LinguaFusionError as exc:
            self._emit(Error(exc.code, f"speech for caption {final.seq} failed: {exc.public_message}"))
            return
        if wav:
            self._emit(Speech(seq=final.seq, lang=target, audio_base64=base64.b64encode(wav).decode("ascii")))
