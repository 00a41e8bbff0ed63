"""A stream's audio in: PCM16 placed on the stream's timeline at once, WebM/Ogg decoded on a StreamDecoder thread
and pumped back onto the loop; then the VAD over every new 32 ms window (in order, each seen once, through the
ModelPort) and the policy's decisions applied (``Decisions``): a partial is a tentative re-decode (at most one in
flight, none while the class drops partials) sent as ``partial``, or ``revision`` when it no longer extends the last
one; a commit cuts its audio off the timeline and queues it as a job (stream/jobs.py) for the finals, in order.
``Arrivals`` remembers when each piece of stream time arrived (caption latency).

``AudioTimeline`` (pure, no clock) is the stream's audio on its own clock: time 0 is the first audio sample. Chunks
carry media timestamps (seconds on the client's clock). A chunk is written where its timestamp says: a gap becomes
silence (not a shift), a late or out-of-order chunk inside the reorder window lands in its place, one older than the
window (or before audio already consumed) is dropped and counted. A chunk placed over audio already received (not
into a gap's silence) overwrites it and is counted as ``overlapped``: both are a client's clock running backward,
which the stream tells its client (``backward_notice``). Memory is bounded: audio before ``consumed`` is released
(at each commit, and in a pause up to the open utterance's start: ``release``), the buffer never holds more than
``max_buffer_s``, and the gaps remembered are those inside the reorder window, at most 256."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptMedia, InvalidParameter, LinguaFusionError
from ..media.stream_decoder import StreamDecoder
from ..tracing import TraceRef, span
from ..types import SR
from .budget import AudioBudget, pay
from .contracts import Alive, Degraded, Emit, Spawn
from .events import Error, Final, Partial, Revision, error_event
from .jobs import Shed, StreamJobs
from .policy import WINDOW, CommitPolicy, Decision, PartialPacer
from .protocol import StreamSpec


# ---- the timeline (pure) -----------------------------------------------------------------------------------------
@dataclass
class TimelineStats:
    chunks: int = 0
    late_dropped: int = 0
    reordered: int = 0
    gap_seconds: float = 0.0
    overlapped: int = 0  # chunks written over audio already received (by more than OVERLAP_SLACK)


OVERLAP_SLACK = SR // 100  # 10 ms: timestamps rounded to the millisecond never count as an overlap
MAX_GAPS = 256


class AudioTimeline:
    def __init__(self, *, reorder_window_s: float = 2.0, max_buffer_s: float = 60.0) -> None:
        self.reorder_window = reorder_window_s
        self.max_buffer = int(max_buffer_s * SR)
        self.origin: float | None = None  # client timestamp of stream time 0
        self.start = 0  # sample index (stream time) of buf[0]
        self.buf = np.zeros(0, dtype=np.float32)
        self.end = 0  # furthest sample written
        self.stats = TimelineStats()
        self.gaps: list[tuple[int, int]] = []  # [a, b) silence inserted for a gap, not yet filled (reorder window)

    @property
    def end_s(self) -> float:
        return self.end / SR

    def write(self, samples: np.ndarray, ts: float | None = None) -> bool:
        """Place ``samples`` at client time ``ts`` (None: right after the furthest sample). False if dropped. An
        empty chunk places nothing: it neither sets the clock (the first chunk's ``ts`` does) nor counts as dropped."""
        if len(samples) == 0:
            return True
        self.stats.chunks += 1
        if ts is None:
            pos = self.end
        else:
            if self.origin is None:
                self.origin = ts - self.end / SR
            pos = int(round((ts - self.origin) * SR))
        if self.origin is None:
            self.origin = 0.0
        n = len(samples)
        if pos + n <= self.start or self.end - pos > self.reorder_window * SR:
            self.stats.late_dropped += 1
            return False
        if pos < self.start:  # partly before consumed audio: keep the part after it
            samples = samples[self.start - pos:]
            pos = self.start
            n = len(samples)
        if pos < self.end:
            self.stats.reordered += 1
            if min(pos + n, self.end) - pos - self._fill(pos, pos + n) > OVERLAP_SLACK:
                self.stats.overlapped += 1
        elif pos > self.end:
            self.stats.gap_seconds += (pos - self.end) / SR
            self.gaps.append((self.end, pos))
            floor = pos - int(self.reorder_window * SR)  # a chunk before this is dropped: its gap cannot be filled
            self.gaps = [(a, b) for a, b in self.gaps if b > floor][-MAX_GAPS:]
        need = pos + n - self.start
        if need > len(self.buf):
            if need > self.max_buffer:
                # never grow without bound: release the oldest audio (the caller consumes long before this)
                cut = pos + n - self.max_buffer
                self.consume(cut)
                if self.start < min(cut, pos):  # a gap longer than the buffer: release its silence too
                    self.start = min(cut, pos)
                need = pos + n - self.start
            grown = np.zeros(need, dtype=np.float32)
            grown[: len(self.buf)] = self.buf
            self.buf = grown
        self.buf[pos - self.start: pos - self.start + n] = samples
        self.end = max(self.end, pos + n)
        return True

    def _fill(self, a: int, b: int) -> int:
        """[a, b) is written: the gap samples it fills (removed from ``gaps``)."""
        filled, left = 0, []
        for ga, gb in self.gaps:
            lo, hi = max(a, ga), min(b, gb)
            if lo >= hi:
                left.append((ga, gb))
                continue
            filled += hi - lo
            left += [(x, y) for x, y in ((ga, lo), (hi, gb)) if x < y]
        self.gaps = left
        return filled

    def view(self, t0: float, t1: float | None = None) -> np.ndarray:
        a = max(self.start, int(round(t0 * SR)))
        b = self.end if t1 is None else min(self.end, int(round(t1 * SR)))
        if b <= a:
            return np.zeros(0, dtype=np.float32)
        return self.buf[a - self.start: b - self.start]

    def consume(self, upto_sample: int) -> None:
        upto = min(max(upto_sample, self.start), self.end)
        if upto == self.start:
            return  # nothing to release: no copy
        self.buf = self.buf[upto - self.start:].copy()
        self.start = upto

    def release(self, before_s: float) -> None:
        """Audio before stream time ``before_s`` will not be read again (the silence behind the open utterance):
        let it go now rather than at the next commit, which a long pause puts off (without this, a pause held up to
        ``max_buffer_s`` of silence, 3.8 MB, copied on every write). The reorder window behind the furthest sample
        is kept, so a late chunk is placed, or dropped, exactly as before."""
        self.consume(min(int(round(before_s * SR)), self.end - int(self.reorder_window * SR)))

    def consume_s(self, t: float) -> None:
        self.consume(int(round(t * SR)))


# ---- audio in ----------------------------------------------------------------------------------------------------
Decoded = np.ndarray | CorruptMedia | None  # what the decoder thread hands on: audio, its error, then its end


class Arrivals:
    """(stream time end, wall clock) of the latest audio pieces: when a commit's last word arrived."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float]] = deque(maxlen=4096)

    def note(self, end_s: float) -> None:
        self._seen.append((end_s, time.monotonic()))

    def of(self, t: float) -> float:
        for end, wall in self._seen:
            if end >= t - 1e-3:
                return wall
        return time.monotonic()


VAD_PIECE_WINDOWS = 64  # at most 2 s of audio per VAD call: another stream's windows wait behind one piece at most
BACKWARD_NOTICE_EVERY = 50  # chunks whose ts ran backward: the client is told of the first, then of every 50th


def backward_notice(ts: float, behind_s: float, dropped: bool, told: int, timeline: AudioTimeline) -> Error | None:
    """What the client is told of the ``told``-th chunk (1, 2, ...) whose ``ts`` starts ``behind_s`` before the end
    of the audio already received, and which was ``dropped`` (too late to place: lost from the captions) or written
    over audio received before: an ``invalid_parameter`` error for the first and every ``BACKWARD_NOTICE_EVERY``-th
    after it, else None. A client whose clock runs backward hears of it while it streams, not once per chunk."""
    if (told - 1) % BACKWARD_NOTICE_EVERY:
        return None
    st = timeline.stats
    what = (f"dropped, too late to place (the reorder window is {timeline.reorder_window:g} s, and audio already "
            "transcribed cannot change)" if dropped else "written over that audio")
    return error_event(InvalidParameter(
        f"audio at ts={ts:g} starts {behind_s:.2f} s before the end of the audio already received: {what}. So far "
        f"{st.late_dropped} chunk(s) dropped, {st.overlapped} written over received audio: ts must grow with the "
        f"audio (each chunk's ts is the media time of its first sample). Said again every {BACKWARD_NOTICE_EVERY} "
        "such chunks",
        details={"field": "ts", "ts": ts, "behind_s": round(behind_s, 3), "dropped": dropped,
                 "late_dropped": st.late_dropped, "overlapped": st.overlapped}))


class AudioIngest:
    def __init__(self, spec: StreamSpec, timeline: AudioTimeline, policy: CommitPolicy, jobs: StreamJobs,
                 arrivals: Arrivals, decide: Callable[[Decision], None], closed: Alive, emit: Emit, spawn: Spawn,
                 budget: AudioBudget, trace: TraceRef | None = None) -> None:
        self.spec = spec
        self.timeline = timeline
        self.policy = policy
        self.jobs = jobs
        self.arrivals = arrivals
        self._decide = decide
        self._closed = closed  # True once the session closed: VAD results that come back later decide nothing
        self._emit = emit
        self._spawn = spawn
        self.budget = budget
        self.trace = trace
        self._vad_lock = asyncio.Lock()
        self.vad_pos = 0  # next sample the VAD has not seen
        self._decoder: StreamDecoder | None = None
        self._pump: asyncio.Task[None] | None = None
        self._placed = 0  # chunks placed on the timeline by this session
        self._backward = 0  # chunks whose ts ran backward (dropped, or written over audio received) after that

    def start(self) -> None:
        """The stream went live: a compressed stream (WebM/Ogg) gets its decoder thread and pump task."""
        if self.spec.audio_format == "pcm16":
            return
        loop = asyncio.get_running_loop()
        decoded: asyncio.Queue[Decoded] = asyncio.Queue(maxsize=64)

        def sink(item: Decoded) -> None:  # on the decoder thread: blocks while the stream is behind
            asyncio.run_coroutine_threadsafe(decoded.put(item), loop).result(timeout=120)

        self._decoder = StreamDecoder(self.spec.audio_format, sink)
        self._pump = self._spawn(self._pump_decoded(decoded), "decode-pump")

    async def feed(self, data: bytes, ts: float | None) -> None:
        """PCM16 LE mono 16 kHz bytes at media time ``ts``, or a piece of the declared WebM/Ogg stream."""
        if self._decoder is not None:
            with span(self.trace, "decode", media=self.spec.audio_format, bytes=len(data)):
                await asyncio.to_thread(self._decoder.feed, data)
            return
        if len(data) % 2:
            raise InvalidParameter("PCM16 audio must have an even number of bytes")
        await pay(self.budget, len(data) / 2 / SR, self._emit)  # too long: refused here; ahead: the reader waits
        await self._ingest(np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, ts)

    async def _pump_decoded(self, decoded: asyncio.Queue[Decoded]) -> None:
        while True:
            item = await decoded.get()
            if item is None:
                return
            if isinstance(item, LinguaFusionError):
                self._emit(Error(item.code, item.public_message))
                continue
            for piece in range(0, len(item), int(self.budget.burst_s * SR)):  # a decoder's item is paid as it goes
                chunk = item[piece:piece + int(self.budget.burst_s * SR)]
                await pay(self.budget, len(chunk) / SR, self._emit)
                await self._ingest(chunk, None)

    async def _ingest(self, samples: np.ndarray, ts: float | None) -> None:
        if not len(samples):  # nothing to place (the timeline ignores it too): no clock, no notice, no VAD
            return
        tl = self.timeline
        behind: float | None = None  # how far before the end of the audio received this chunk starts
        # before any chunk is placed, only a resumed stream drops: audio re-sent from before its resume point,
        # transcribed already (nothing is lost, nothing to tell)
        if ts is not None and self._placed and tl.origin is not None:
            behind = tl.end_s - (ts - tl.origin)
        overlapped = tl.stats.overlapped
        placed = tl.write(samples, ts)
        if behind is not None and ts is not None and (not placed or tl.stats.overlapped > overlapped):
            self._backward += 1
            if (notice := backward_notice(ts, behind, not placed, self._backward, tl)) is not None:
                self._emit(notice)
        if not placed:
            return
        self._placed += 1
        self.arrivals.note(self.timeline.end_s)
        async with self._vad_lock:  # windows in order, each seen once, in pieces of at most VAD_PIECE_WINDOWS
            while True:
                end = self.timeline.end
                start = max(self.vad_pos, self.timeline.start)
                n = min((end - start) // WINDOW, VAD_PIECE_WINDOWS)
                if n <= 0:
                    return
                probs = await self.jobs.vad(self.timeline.view(start / SR, (start + n * WINDOW) / SR))
                self.vad_pos = start + n * WINDOW
                if self._closed():
                    return
                for d in self.policy.on_vad(probs, self.vad_pos / SR):
                    self._decide(d)
                # a pause's audio before the open utterance is never decoded: the timeline lets it go now (a commit,
                # which releases the rest, may be minutes away), so a stream's buffer is its utterance, not its pause
                self.timeline.release(self.policy.utt_start)

    def heard(self) -> tuple[float, float | None, bool]:
        """For lips (vision/stream_lips.py): audio heard by the VAD until (stream s), the open speech's start."""
        return self.vad_pos / SR, self.policy.speech_start, "audio" in self.spec.inputs

    async def finish(self) -> None:
        """The client finished sending: the decoder's last samples are placed (within 60 s)."""
        if self._decoder is not None and self._pump is not None:
            self._decoder.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=60)

    def abort(self) -> None:
        if self._decoder is not None:
            self._decoder.close()


class Decisions:
    def __init__(self, spec: StreamSpec, timeline: AudioTimeline, policy: CommitPolicy, jobs: StreamJobs,
                 arrivals: Arrivals, queue: Callable[[Coroutine[object, object, Final | None]], None],
                 degraded: Degraded, live: Alive, emit: Emit, spawn: Spawn,
                 clock: Callable[[], float] = time.monotonic, pacer: PartialPacer | None = None) -> None:
        self.spec = spec
        self.timeline = timeline
        self.policy = policy
        self.jobs = jobs
        self.arrivals = arrivals
        self._queue = queue  # a commit's job, for the finals in order (stream/finals.py)
        self._degraded = degraded
        self._live = live  # a partial still worth sending: the stream is live
        self._emit = emit
        self._spawn = spawn
        self._partial: asyncio.Task[None] | None = None
        self._clock = clock
        self.pacer = pacer or PartialPacer(policy.cfg.step_s, policy.cfg.max_utterance_s)  # partials spaced by load
        self._utterance = 0
        self._last_partial = ""
        self._revision = 0

    def apply(self, d: Decision) -> None:
        now = self._clock()
        if d.kind == "partial" and self.spec.partials and not self._degraded("drop_partials") \
                and (self._partial is None or self._partial.done()) and self.pacer.due(now):
            self.pacer.started(now)
            audio = self.timeline.view(d.start, d.end).copy()
            self._partial = self._spawn(self._partial_job(audio, d, self._utterance), "partial")
        elif d.kind == "commit":
            audio = self.timeline.view(d.start, d.end).copy()
            self._queue(self.jobs.commit(audio, d.start, d.end, self.arrivals.of(d.end), d.cut or "pause"))
            self._utterance += 1
            self._last_partial = ""
            self.timeline.consume_s(d.end)

    async def _partial_job(self, audio: np.ndarray, d: Decision, utterance: int) -> None:
        t0 = self._clock()
        res = await self.jobs.partial(audio, lambda: utterance == self._utterance and self._live())
        if isinstance(res, Shed):  # refused at once, or shed at its deadline: either way, the engine is full
            self.pacer.shed(self._clock() - t0)
            return
        self.pacer.done(self._clock() - t0)
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
