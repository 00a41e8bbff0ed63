"""A live stream's signs: the landmarks ``FrameConsumer`` of a stream started with a ``vocabulary_id``.

Frames are sampled, queued and read as ``lane.py`` says; each frame's landmarks tell the sampler the hands' speed,
and frames with a hand are collected into the current sign. A sign ends when no hand has
been seen for ``gap_s``; it is then recognised against the stream's vocabulary, and a known gloss is translated into
every target over the ModelPort (MT, like any source text) and sent as a ``sign`` event on the stream's timeline.
``finish`` (the stream ends) recognises a sign still open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BackendError
from ..serving.keys import ModelKey
from ..serving.ports import CallContext, MtInput
from ..stream.events import Event, Sign
from .landmarks import LandmarkFrame, LandmarkSeq
from .lane import LandmarkLane
from .recogniser import Recogniser
from .sampler import AdaptiveSampler, SamplingPolicy
from .segment import sign_spans
from .service import VisionService, gloss_text

if TYPE_CHECKING:
    from ..stream.contracts import Emit, Heard, Queue, Spawn
    from ..stream.jobs import StreamJobs
    from ..stream.protocol import StreamSpec
    from ..stream.video import StreamVideo

MAX_SIGN_FRAMES = 600  # one sign's frames at most (a hand never leaving the picture is cut there)



def _video(video: object) -> StreamVideo:
    """The stream's video (``stream.contracts.Vocabularies`` passes it as ``object``): a ``StreamVideo``."""
    from ..stream.video import StreamVideo

    if not isinstance(video, StreamVideo):
        raise TypeError(f"a stream's video is a StreamVideo, not {type(video).__name__}")
    return video


class StreamSigns(LandmarkLane):
    what = "sign"

    def __init__(self, recogniser: Recogniser, extract: Callable[[float, np.ndarray], LandmarkFrame], jobs: StreamJobs,
                 emit: Callable[[Event], None], spawn: Spawn,
                 loop: asyncio.AbstractEventLoop, policy: SamplingPolicy | None = None, gap_s: float = 0.6,
                 pool: Executor | None = None) -> None:
        super().__init__(extract, emit, spawn, loop, AdaptiveSampler(policy), pool)
        self.recogniser = recogniser
        self.jobs = jobs
        self.gap_s = gap_s
        self._sign: list[LandmarkFrame] = []
        self._last_hand_t: float | None = None
        self.signs = 0

    async def landmarks(self, lm: LandmarkFrame) -> None:
        with self._lock:
            self.sampler.observe(lm)
        if lm.any_hand:
            self._sign.append(lm)
            self._last_hand_t = lm.t
            if len(self._sign) >= MAX_SIGN_FRAMES:
                await self._close_sign()
        elif self._sign and self._last_hand_t is not None and lm.t - self._last_hand_t >= self.gap_s:
            await self._close_sign()

    async def _close_sign(self) -> None:
        frames, self._sign = self._sign, []
        if len(frames) < 3:
            return  # a hand glimpsed in a frame or two: not a sign
        seq = LandmarkSeq.from_frames(frames)
        if not sign_spans(seq, gap_s=self.gap_s):
            return
        result = await asyncio.to_thread(self.recogniser.recognise, seq)
        if not result.known:
            return
        self.signs += 1
        translations = await self._translate(gloss_text(result.gloss))
        spec = self.jobs.spec
        stats = self.sampler.stats()
        self._emit(Sign(t=float(seq.t[0]), end=float(seq.t[-1]), gloss=result.gloss, confidence=result.confidence,
                        text=translations.get(spec.targets[0], ""), translations=translations,
                        modalities=["sign"], frames={"decoded": stats.decoded, "analysed": stats.analysed}))

    def _ctx(self) -> CallContext:
        spec = self.jobs.spec
        return CallContext(spec.stream_id, spec.slo, spec.importance, False, None, key_id=spec.key_id)

    async def _translate(self, text: str) -> dict[str, str]:
        spec = self.jobs.spec

        async def one(target: str) -> str:
            if target == spec.source_lang:
                return self.jobs.written(text, target)
            try:
                return self.jobs.written(str(await self.jobs.port.run(ModelKey.mt(spec.source_lang, target),
                                                                      MtInput(text, []), self._ctx()) or ""), target)
            except BackendError:
                return ""  # the gloss still goes out

        outs = await asyncio.gather(*(one(t) for t in spec.targets))
        return dict(zip(spec.targets, outs, strict=True))

    async def finish(self, wait_s: float) -> None:
        """The stream ends: analyse what is queued and recognise a sign still open (bounded by ``wait_s``)."""
        async def last() -> None:
            await self.read_all()
            if self._sign:
                await self._close_sign()

        try:
            await asyncio.wait_for(last(), timeout=wait_s)
        except Exception:  # noqa: BLE001 - a timeout, or an error already sent as an event
            return


class StreamVocabularies:
    """``stream.contracts.Vocabularies`` on a VisionService: what the app hands the stream service, so that the
    session reads a stream's signs and lips without importing vision/."""

    def __init__(self, vision: VisionService) -> None:
        self.vision = vision

    def check(self, key_id: str, vocabulary_id: str) -> None:
        self.vision.store.recogniser(key_id, vocabulary_id)  # not found for another key; refused when untaught

    async def attach(self, video: object, spec: StreamSpec, jobs: StreamJobs, emit: Emit, spawn: Spawn, *,
                     queue: Queue, heard: Heard) -> None:
        """Attach the stream's vocabulary consumer to its video fan-out (``video``: stream/video.py
        ``StreamVideo``): signs for a sign vocabulary; for a lip vocabulary, lips fused with the stream's speech
        (``stream_lips.py``, which needs the session's ``queue`` of finals and what audio it has ``heard``). The
        store is read on a worker thread (disk or network; a recogniser changed since the stream opened is
        rebuilt)."""
        from ..video.fanout import Tap

        vision = self.vision
        recogniser = await asyncio.to_thread(vision.store.recogniser, spec.key_id, spec.vocabulary_id)
        if recogniser.kind == "lip":
            from . import stream_lips

            stream_lips.attach(_video(video), vision, recogniser, jobs, emit, spawn, queue, heard)
            return
        extractor = vision.extractor()
        session = f"stream-{spec.stream_id}"

        def extract(t: float, rgb: np.ndarray) -> LandmarkFrame:
            return extractor.extract([(t, rgb)], parts=frozenset({"hands"}), session=session)[0]

        signs = StreamSigns(recogniser, extract, jobs, emit, spawn, asyncio.get_running_loop(), pool=vision.pool)
        _video(video).fanout.attach(Tap("signs", signs, fps=30.0))

    async def finish(self, video: object, wait_s: float) -> None:
        """The stream ends: a sign still being made, or lip movements not yet decided, go out (bounded)."""
        fanout = _video(video).fanout
        consumer = fanout.get("signs") or fanout.get("lips")
        if isinstance(consumer, LandmarkLane):  # the taps attach() made: StreamSigns, StreamLips
            await consumer.finish(wait_s)
