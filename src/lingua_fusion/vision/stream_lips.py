"""A live stream's lips: the lip-landmarks ``FrameConsumer`` of a stream started with a lip vocabulary, and the
fusion of what they said with each utterance's speech before its final is committed.

Frames are sampled, queued and read as ``lane.py`` says (a steadier sampling floor than for signs: lips move little
and fast). The last ``MAX_KEPT`` frames with their lips are kept.

Fusion (``StreamJobs.commit`` calls ``claim`` when an utterance is committed and ``fuse`` once its ASR is back):
the lips of the utterance's span are spotted for vocabulary words (``lip_spot.py``) and ``fusion.fuse`` confirms,
re-ranks or replaces the final's words, or, when the speech was gated (confidence below the stream's
``min_confidence``) or empty, makes the caption from the lips alone. A final waits at most ``EVIDENCE_WAIT_S`` for
the frames of its span to be analysed (only while frames are still arriving or queued: a video that dropped out
costs no wait) and the whole step at most ``FUSE_TIMEOUT_S``; past that it goes out from speech alone.

Audio dropping out: a lip movement that no utterance claimed, once the audio has been heard past it with no speech
open over it (or no audio has arrived for ``HEARD_WAIT_S``, or the stream takes no audio), is spotted on its own,
and a known word becomes a final of its own (``modalities: ["lips"]``), queued in the stream's order of finals.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..stream.events import Event, Final
from .fusion import Evidence, FusedCaption, FusionPolicy, fuse
from .landmarks import LandmarkFrame
from .lane import LandmarkLane
from .lip_spot import SpotPolicy, active_spans, hypothesis, opening, rest_level, smooth, spot

if TYPE_CHECKING:
    from ..stream.contracts import Queue, Spawn
    from ..stream.jobs import StreamJobs
    from ..stream.video import StreamVideo
    from .service import VisionService
from .recogniser import Recogniser
from .sampler import AdaptiveSampler, SamplingPolicy
from .segment import Span
from .service import gloss_text

MAX_KEPT = 900  # frames with their lips kept (a minute at 15 fps)
RECENT_S = 6.0  # unclaimed lip movements are looked for in this much of the newest frames
MAX_ALONE = 8  # unclaimed lip movements waiting to learn whether speech covered them
EVIDENCE_WAIT_S = 2.0
FUSE_TIMEOUT_S = 5.0
HEARD_WAIT_S = 3.0  # no audio heard for this long (wall clock): the audio dropped out
ALONE_MAX_S = 30.0  # an unclaimed movement is decided within this long, whatever the audio does
# a lip word this sure replaces a vocabulary word the ASR was unsure of: the recogniser's confidence is a margin
# (1 - nearest / next distance), about 0.3-0.5 for a correct lip word of a small vocabulary (bench/signs.py)
REPLACE_CONFIDENCE = 0.3
LIP_SAMPLING = SamplingPolicy(min_fps=15.0, max_fps=25.0, budget_fps=20.0, burst=10.0)  # lips need >= 15 fps

# () -> (audio heard until, in stream seconds; start of the speech still open or None; does the stream take audio)
Heard = Callable[[], tuple[float, float | None, bool]]


class StreamLips(LandmarkLane):
    what = "lip"

    def __init__(self, recogniser: Recogniser, extract: Callable[[float, np.ndarray], LandmarkFrame], jobs: StreamJobs,
                 emit: Callable[[Event], None], spawn: Spawn, queue: Queue, heard: Heard,
                 loop: asyncio.AbstractEventLoop, *, sampling: SamplingPolicy | None = None,
                 spotting: SpotPolicy | None = None, pool: Executor | None = None) -> None:
        super().__init__(extract, emit, spawn, loop, AdaptiveSampler(sampling or LIP_SAMPLING), pool)
        self.recogniser = recogniser
        self.vocabulary = set(recogniser.glosses)
        self.jobs = jobs
        self._queue_final = queue
        self._heard = heard
        self.spotting = spotting or SpotPolicy()
        self.frames: deque[LandmarkFrame] = deque(maxlen=MAX_KEPT)
        self._openings: deque[float] = deque(maxlen=MAX_KEPT)  # each kept frame's mouth opening
        self._rest = 0.0  # the stream's resting opening, updated as frames come
        self._analysed_t = -1e9
        self._progress = asyncio.Event()
        self._claims: deque[tuple[float, float]] = deque(maxlen=256)
        self._handled_until = -1e9  # lip movements up to here are claimed or being decided
        self._alone: set[asyncio.Task[None]] = set()
        self._ending = False
        self.confirmed = 0  # finals the lips confirmed, re-ranked or changed
        self.alone = 0  # finals made from lips alone

    async def landmarks(self, lm: LandmarkFrame) -> None:
        self._analysed_t = max(self._analysed_t, lm.t)
        if lm.lips_present:
            self.frames.append(lm)
            self._openings.append(opening(lm))
            self._rest = rest_level(smooth(self._openings).tolist(), self.spotting)
        self._progress.set()
        self._unclaimed()

    def _busy(self, end: float) -> bool:
        """Are lips of time ``end`` still to come: frames queued or being read, or frames arriving short of it."""
        t, wall = self._offered
        return self.reading() or (t < end and time.monotonic() - wall < 0.5)

    async def _caught_up(self, end: float, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self._analysed_t < end and self._busy(end):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), timeout=min(left, 0.25))
            except TimeoutError:
                continue

    async def _evidence(self, start: float, end: float) -> list[Evidence]:
        m = self.spotting.margin_s
        pairs = [(f, o) for f, o in zip(self.frames, self._openings, strict=True) if start - m <= f.t <= end + m]
        if len(pairs) < 3:
            return []
        frames = [f for f, _ in pairs]
        spans = [s for s in active_spans(frames, self._rest, self.spotting, [o for _, o in pairs])
                 if s.end >= start and s.start <= end]
        if not spans:
            return []
        return await asyncio.to_thread(spot, frames, spans, self.recogniser, self.spotting)

    # ---- fusion with an utterance (StreamJobs.commit) --------------------------------------------------------
    def claim(self, start: float, end: float) -> None:
        """An utterance was committed over [start, end]: its lip movements belong to its final."""
        self._claims.append((start, end))

    async def fuse(self, text: str, confidence: float, start: float, end: float) -> FusedCaption | None:
        """The utterance's caption with its lips: None when the lips had nothing to say (or took too long)."""
        try:
            return await asyncio.wait_for(self._fuse(text, confidence, start, end), timeout=FUSE_TIMEOUT_S)
        except TimeoutError:
            return None

    async def _fuse(self, text: str, confidence: float, start: float, end: float) -> FusedCaption | None:
        await self._caught_up(end, EVIDENCE_WAIT_S)
        evidence = await self._evidence(start, end)
        if not evidence:
            return None
        hyp = hypothesis(text, confidence, start, end, evidence, self.vocabulary)
        policy = FusionPolicy(min_asr_confidence=self.jobs.spec.min_confidence, replace_confidence=REPLACE_CONFIDENCE)
        caption = fuse([hyp] if hyp.words else [], evidence, self.vocabulary, policy)
        if caption is None or "lips" not in caption.modalities:
            return caption
        if "audio" in caption.modalities:
            self.confirmed += 1
            return caption
        self.alone += 1
        return replace(caption, text=gloss_text(caption.text))

    # ---- lips without speech -----------------------------------------------------------------------------------
    def _claimed(self, span: Span) -> bool:
        return any(a <= span.end and span.start <= b for a, b in self._claims)

    def _unclaimed(self) -> None:
        """Closed lip movements after the last handled one that no utterance claimed: each is decided apart."""
        since = max(self._handled_until, self._analysed_t - RECENT_S)
        recent = [(f, o) for f, o in zip(self.frames, self._openings, strict=True) if f.t > since]
        if len(recent) < 3:
            return
        for span in active_spans([f for f, _ in recent], self._rest, self.spotting, [o for _, o in recent]):
            if not self._ending and self._analysed_t - span.end < self.spotting.gap_s:
                break  # still moving
            self._handled_until = span.end + self.spotting.gap_s
            if self._claimed(span) or len(self._alone) >= MAX_ALONE:
                continue
            task = self._spawn(self._decide_alone(span), "lips-alone")
            self._alone.add(task)
            task.add_done_callback(self._alone.discard)

    def _speech_over(self, span: Span) -> bool | None:
        """True: speech was (or is still) heard over ``span``; False: the audio passed it in silence, or dropped
        out; None: not known yet."""
        heard_until, speech_from, has_audio = self._heard()
        if not has_audio:
            return False
        if speech_from is not None and speech_from <= span.end:
            return None if not self._ending else True  # an utterance still open: its commit will claim it
        return False if heard_until >= span.end + 0.5 or self._ending else None

    async def _decide_alone(self, span: Span) -> None:
        t0 = last_move = time.monotonic()
        heard = self._heard()[0]
        while time.monotonic() - t0 < ALONE_MAX_S:
            if self._claimed(span):
                return
            over = self._speech_over(span)
            if over is not None:
                break
            now_heard = self._heard()[0]
            if now_heard > heard:
                heard, last_move = now_heard, time.monotonic()
            elif time.monotonic() - last_move > HEARD_WAIT_S:
                break  # no audio for a while: it dropped out
            await asyncio.sleep(0.1)
        await asyncio.sleep(0)  # a commit spawned just now claims its span first
        if self._claimed(span) or self._speech_over(span):
            return
        evidence = await self._evidence(span.start, span.end)
        if not evidence:
            return
        caption = fuse([], evidence, self.vocabulary, FusionPolicy())
        if caption is None:
            return
        self.claim(span.start, span.end)
        self.alone += 1
        self._queue_final(self._alone_final(caption))

    async def _alone_final(self, caption: FusedCaption) -> Final | None:
        final = await self.jobs.translate(gloss_text(caption.text), caption.start, caption.end,
                                          confidence=caption.confidence, wall_ref=time.monotonic(),
                                          modality="lips")
        if final is not None:
            final.modalities = list(caption.modalities)
        return final

    async def finish(self, wait_s: float) -> None:
        """The stream ends: read what is queued, decide every lip movement not yet decided (bounded)."""
        async def last() -> None:
            await self.read_all()
            self._ending = True
            self._unclaimed()
            if self._alone:
                await asyncio.gather(*list(self._alone), return_exceptions=True)

        try:
            await asyncio.wait_for(last(), timeout=wait_s)
        except Exception:  # noqa: BLE001 - a timeout, or an error already sent as an event
            return


def attach(video: StreamVideo, vision: VisionService, recogniser: Recogniser, jobs: StreamJobs,
           emit: Callable[[Event], None], spawn: Spawn, queue: Queue, heard: Heard) -> StreamLips:
    """Attach a stream's lips consumer to its video fan-out and its fusion to its commits (``jobs.lips``)."""
    from ..video.fanout import Tap

    extractor = vision.extractor()
    session = f"stream-lips-{jobs.spec.stream_id}"

    def extract(t: float, rgb: np.ndarray) -> LandmarkFrame:
        return extractor.extract([(t, rgb)], parts=frozenset({"lips"}), session=session)[0]

    lips = StreamLips(recogniser, extract, jobs, emit, spawn, queue, heard, asyncio.get_running_loop(),
                      pool=vision.pool)
    video.fanout.attach(Tap("lips", lips, fps=30.0))
    jobs.lips = lips
    return lips
