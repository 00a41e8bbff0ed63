"""A live stream's video frames -> ``slide`` events: change detection on every frame, OCR and MT only on a change.

``StreamSlides`` is the stream's slides ``FrameConsumer``. Its ``offer`` runs in the worker thread that decoded the
frame (the session decodes off the event loop), computes the frame's signature and asks the detector; a settled
change is handed to the event loop (``call_soon_threadsafe``), where at most one read runs per stream: OCR over the
ModelPort (``ocr`` key, through the executor), rows in reading order, then every row translated into every target
(``mt`` keys). Changes that settle while a read is running wait in order, at most ``MAX_WAITING``; beyond that the
oldest waiting one is dropped (counted as ``superseded``: the audience has moved on), so a stream holds at most
one running and ``MAX_WAITING`` waiting frames.

The slide's words join the stream's slide memory (``StreamJobs.slides``): ASR context and MT names for the next
utterances, as for ``image`` messages.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Coroutine

import numpy as np

from ..config import LimitSettings
from ..errors import BackendError, LinguaFusionError
from ..serving.keys import ModelKey
from ..serving.ports import CallContext, MtInput
from ..video.frames import FrameStats, VideoFrame
from ..video.slides import Change, DetectorConfig, Row, SlideDetector, reading_order, same_text, signature
from .contracts import Slots, Spawn
from .events import Error, Event, Slide
from .jobs import MAX_SLIDES, StreamJobs
from .wire import VideoStatsJSON

MAX_WAITING = 4  # settled changes waiting for OCR per stream (frames sent faster than real time)
FINISH_WAIT_S = 60.0  # at the end of a stream, slides still being read get this long (a cold OCR model loads first)


class StreamSlides:
    def __init__(self, jobs: StreamJobs, emit: Callable[[Event], None],
                 spawn: Callable[[Coroutine[object, object, None], str], asyncio.Task[None]],
                 loop: asyncio.AbstractEventLoop, cfg: DetectorConfig | None = None) -> None:
        self.jobs = jobs
        self._emit = emit
        self._spawn = spawn
        self._loop = loop
        self.detector = SlideDetector(cfg)
        self._lock = threading.Lock()  # offers of one stream may come from two worker threads (in-process feeds)
        self._running: asyncio.Task[None] | None = None
        self._waiting: deque[tuple[Change, np.ndarray]] = deque()
        self._last_text = ""
        self._last_t = 0.0
        self._last_rgb: np.ndarray | None = None
        self.decoded = 0
        self.analysed = 0  # OCR calls
        self.superseded = 0  # settled changes replaced by a newer one before they were read

    # ---- FrameConsumer (worker thread) -----------------------------------------------------------------------
    def offer(self, frame: VideoFrame) -> None:
        sig = signature(frame.rgb)
        with self._lock:
            self.decoded += 1
            if frame.t + 1e-9 < self._last_t:
                return  # a frame older than one already seen: change detection needs time order
            self._last_t, self._last_rgb = frame.t, frame.rgb
            change = self.detector.observe(frame.t, sig)
        if change is not None and not change.blank:
            self._loop.call_soon_threadsafe(self._want, change, frame.rgb)

    def stats(self) -> FrameStats:
        return FrameStats(decoded=self.decoded, analysed=self.analysed)

    # ---- reads (event loop) ----------------------------------------------------------------------------------
    def _want(self, change: Change, rgb: np.ndarray) -> None:
        if self._running is not None and not self._running.done():
            if len(self._waiting) >= MAX_WAITING:
                self._waiting.popleft()
                self.superseded += 1
            self._waiting.append((change, rgb))
            return
        self._running = self._spawn(self._reads(change, rgb), "slide")

    async def _reads(self, change: Change, rgb: np.ndarray) -> None:
        item: tuple[Change, np.ndarray] | None = (change, rgb)
        while item is not None:
            try:
                await self._read(*item)
            except (BackendError, LinguaFusionError) as exc:
                self._emit(Error(exc.code, f"slide not read: {exc.public_message}"))
            item = self._waiting.popleft() if self._waiting else None

    def _ctx(self) -> CallContext:
        spec = self.jobs.spec
        return CallContext(spec.stream_id, spec.slo, spec.importance, False, None, key_id=spec.key_id)

    async def _read(self, change: Change, rgb: np.ndarray) -> None:
        self.analysed += 1
        lines = await self.jobs.port.run(ModelKey.ocr(), rgb, self._ctx())
        rows = reading_order(list(lines or []))
        text = "\n".join(r.text for r in rows)
        if not rows or same_text(text, self._last_text):
            return  # no text, or the same slide again (a hand or a pointer crossed it)
        self._last_text = text
        self.jobs.slides.append((change.start, text.replace("\n", "  ")))
        del self.jobs.slides[:-MAX_SLIDES]
        translations = await self._translate(rows)
        spec = self.jobs.spec
        first = spec.targets[0]
        self._emit(Slide(t=change.start, source_text=text, text="\n".join(translations[first]),
                         translations={k: "\n".join(v) for k, v in translations.items()},
                         lines=[{"source_text": r.text, "title": r.title,
                                 "translations": {k: v[i] for k, v in translations.items()}}
                                for i, r in enumerate(rows)],
                         settled_t=change.t))

    async def _translate(self, rows: list[Row]) -> dict[str, list[str]]:
        spec = self.jobs.spec
        src = spec.source_lang

        async def one(target: str) -> list[str]:
            if target == src:
                return [self.jobs.written(r.text, target) for r in rows]
            key = ModelKey.mt(src, target)
            try:
                outs = await asyncio.gather(*(self.jobs.port.run(key, MtInput(r.text, self.jobs.glossary),
                                                                 self._ctx()) for r in rows))
            except BackendError:
                return ["" for _ in rows]  # the slide's source text still goes out
            return [self.jobs.written(str(o or ""), target) for o in outs]

        targets = list(spec.targets)
        outs = await asyncio.gather(*(one(t) for t in targets))
        return dict(zip(targets, outs, strict=True))

    async def finish(self, wait_s: float) -> None:
        """The stream ends: a picture shown until the end counts as settled; wait (bounded) for the reads."""
        with self._lock:
            change = self.detector.finish(self._last_t) if self._last_rgb is not None else None
            rgb = self._last_rgb
        if change is not None and not change.blank and rgb is not None:
            self._want(change, rgb)
        task = self._running
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=max(wait_s, FINISH_WAIT_S))
            except Exception:  # noqa: BLE001 - a timeout, or an error already sent as an event
                self._waiting.clear()
                task.cancel()  # nothing may be sent after the stream's closed event


class StreamVideo:
    """A stream's video frames: each ``frame`` message is decoded off the event loop (at most ``slots`` decoded
    frames in memory across the service) and offered to the stream's fan-out (the slides consumer, and any other
    attached consumer: ``fanout.attach``)."""

    def __init__(self, jobs: StreamJobs, emit: Callable[[Event], None],
                 spawn: Spawn, alive: Callable[[], bool], limits: LimitSettings, slots: Slots,
                 owner: object = None) -> None:
        from ..video.fanout import STREAM_CONSUMERS, FrameFanout, Tap

        def spawn_live(coro: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
            if not alive():  # the stream closed while this change settled: nothing more is read
                coro.close()
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done  # type: ignore[return-value]
            return spawn(coro, name)

        self.slides = StreamSlides(jobs, emit, spawn_live, asyncio.get_running_loop())
        self.fanout = FrameFanout([Tap("slides", self.slides, fps=30.0)])  # every frame sent is looked at
        for name, factory in STREAM_CONSUMERS.items():
            tap = factory(owner)
            if tap is not None:
                tap.name = tap.name or name
                self.fanout.attach(tap)
        self._limits = limits
        self._slots = slots

    async def feed(self, data: bytes, t: float) -> None:
        from ..errors import Overloaded
        from ..media import decode_image

        key = self.slides.jobs.spec.key_id
        if not self._slots.take(key):
            raise Overloaded("the server is decoding too many frames (of this key, or of all); send fewer",
                             retry_after=1.0)
        try:
            def work() -> None:
                self.fanout.offer(VideoFrame(t=t, rgb=decode_image(data, self._limits)))

            await asyncio.to_thread(work)
        finally:
            self._slots.give(key)

    async def finish(self, wait_s: float) -> None:
        await self.slides.finish(wait_s)

    def stats(self) -> VideoStatsJSON:
        s = self.slides.stats()
        return {"frames": s.decoded, "ocr_calls": s.analysed, "superseded": self.slides.superseded}
