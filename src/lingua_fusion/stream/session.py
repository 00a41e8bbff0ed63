"""One live stream: its lifecycle, its three verbs and its event queue, wiring the parts that do the work.

Its face is three verbs and a queue: ``feed_audio`` / ``feed_image`` / ``feed_text``, ``end``, and ``events``
(and, on a ``diarize`` stream, ``rename_speaker``).
Everything else (opening, resuming, admission, the breaker's notices, shedding, drain) is the StreamService's.

Input (audio / image / text with media timestamps) -> timeline -> VAD (off the event loop, batched with other
streams) -> policy decisions. A partial decode is tentative (at most one in flight; the scheduler may shed it). A
commit becomes a job (stream/jobs.py) queued in order; the emitter awaits jobs in that order, numbers finals 1, 2,
3, ... with no gaps, logs each (stream/journal.py) and then sends it. Events go to a bounded queue: a client that
stops reading gets a clear close instead of unbounded buffering. The parts, each handed what it needs
(stream/contracts.py); its way out is the ``Outbox`` here: one bounded event queue, a tap that sees every
event first, and ``outgoing``, what the client is sent (a client that stops reading fills the queue: the session
is told and closes the stream with a clear error instead of buffering without bound):

    stream/ingest.py     audio in (PCM16, or WebM/Ogg through a decoder thread) -> timeline -> VAD -> the
                         policy's decisions applied: partials and revisions; commits queued as jobs
    stream/images.py     ``image`` and ``frame`` messages: OCR into slides, degraded classes thinned
    stream/finals.py     commit jobs awaited in order, numbered, logged, sent (metrics, speech)
    stream/resume.py     the snapshot a resumed stream continues from
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..config import Settings
from ..errors import BackendError, InvalidParameter, LinguaFusionError, SlowConsumer, TakenOver, TooLarge
from ..serving.ports import SLO_CLASSES, ModelPort
from ..tracing import TraceRef
from ..types import SR
from .budget import AudioBudget, PixelBudget, pixel_budget
from .contracts import Slots, Vocabularies
from .events import Closed, Event, Final, Ready, error_event
from .finals import Finals
from .images import LOW_FRAME_INTERVAL_S, MAX_IMAGES_IN_FLIGHT, Images
from .ingest import Arrivals, AudioIngest, AudioTimeline, Decisions
from .jobs import StreamJobs
from .journal import Journal, StreamLog
from .policy import CommitPolicy, PartialPacer
from .protocol import AUTO, StreamSpec, check_ts
from .resume import ResumePoint
from .speakers import StreamSpeakers
from .wire import FinalJSON, ResumedJSON

if TYPE_CHECKING:
    from .video import StreamVideo

T = TypeVar("T")
log = logging.getLogger("lingua_fusion.streams")

__all__ = ["LOW_FRAME_INTERVAL_S", "MAX_IMAGES_IN_FLIGHT", "Outbox", "Slots", "State", "StreamOwner", "StreamSession"]


def partial_pacer(settings: Settings, spec: StreamSpec, policy: CommitPolicy) -> PartialPacer:
    """A stream's partials spaced by load (``server.partial_pace``; wider as the round trip nears its SLO target)."""
    s = settings.server
    return PartialPacer(policy.cfg.step_s, policy.cfg.max_utterance_s, s.partial_pace, full_ratio=s.partial_pace_full,
                        full_rtt_s=s.partial_pace_full_rtt * SLO_CLASSES.get(spec.slo, 3.0))


class Outbox:
    def __init__(self, max_events: int, full: Callable[[], None]) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue(maxsize=max_events)
        self._full = full
        # sees every event the session emits, first (a room's publisher: rooms/publisher.py); must never block
        self.tap: Callable[[Event], None] | None = None

    def emit(self, event: Event) -> None:
        if self.tap is not None:
            self.tap(event)
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self._full()

    async def outgoing(self, closed: asyncio.Event,
                       error: Callable[[], LinguaFusionError | None]) -> AsyncIterator[Event]:
        """Every queued event through ``closed``; a stream that ended without one (``closed`` set: slow consumer,
        shed, drain) gives what was queued, then the ``error()`` saying why."""
        while True:
            get = asyncio.ensure_future(self.events.get())
            was_closed = asyncio.ensure_future(closed.wait())
            try:
                done, _ = await asyncio.wait({get, was_closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the reader is cancelled (its client left): neither waiter is left pending
                for waiter in (get, was_closed):
                    if not waiter.done():
                        waiter.cancel()
            if get in done:
                event = get.result()
                yield event
                if event.TYPE == "closed":
                    return
                continue
            while not self.events.empty():
                yield self.events.get_nowait()
            why = error()
            if why is not None:
                yield error_event(why)
            return


class State(enum.IntEnum):
    OPENING = 0
    LIVE = 1
    DRAINING = 2
    CLOSED = 3


class StreamOwner(Protocol):
    """What a session needs from the service that owns it."""

    vocabularies: Vocabularies | None  # taught signs and lips (injected: vision/), read by streams with a vocabulary_id

    def degraded(self, slo: str, step: str, key_id: str = "") -> bool:
        """Is the breaker's ``step`` active for this SLO class now, for the streams of ``key_id``?"""
        ...

    def caption_done(self, slo: str, seconds: float, key_id: str = "") -> None:
        """A final of ``key_id``'s stream went out ``seconds`` after its words arrived."""
        ...

    def released(self, session: StreamSession) -> None:
        """The session closed: free what it held."""
        ...


class StreamSession:
    def __init__(self, spec: StreamSpec, port: ModelPort, owner: StreamOwner, settings: Settings, *,
                 log: StreamLog | None = None, max_events: int = 256, resume: Mapping[str, object] | None = None,
                 image_slots: Slots | None = None, trace: TraceRef | None = None,
                 pixels: PixelBudget | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.owner = owner
        self.settings = settings
        self._resume = resume  # the stored snapshot when this session continues a stream after a restart
        self.state = State.OPENING
        self.timeline = AudioTimeline()
        self.policy = CommitPolicy(spec.policy)
        self.trace = trace  # the stream's span (tracing on; the StreamService ends it): stages are its children
        self.jobs = StreamJobs(spec, port, trace)
        if spec.diarize:  # each final's speaker (stream/speakers.py)
            self.jobs.speakers = StreamSpeakers(port, spec.max_speakers, settings.diarize, self.jobs.committed)
        self.outbox = Outbox(max_events, lambda: self.fail(SlowConsumer(
            "the client is not reading events; the stream was closed")))
        self.events = self.outbox.events
        self._emit = self.outbox.emit
        self.journal = Journal(log, spec.stream_id, self._emit, wait_s=settings.state.log_wait_s,
                               fail=self.fail) if log is not None else None
        self._tasks: set[asyncio.Task[object]] = set()
        self._emitter: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: LinguaFusionError | None = None
        self.image_slots = image_slots or Slots(MAX_IMAGES_IN_FLIGHT)  # the same, across the service's streams
        self._text_until = -1.0  # a resumed stream: re-sent text at or before this stream time was logged already
        self.finals = Finals(spec, self.jobs, self.journal, self.timeline,
                             lambda seconds: owner.caption_done(spec.slo, seconds, spec.key_id), self.fail, self._emit,
                             self._spawn, trace)
        self._pending = self.finals.pending
        arrivals = Arrivals()
        self.decisions = Decisions(spec, self.timeline, self.policy, self.jobs, arrivals, self._queue,
                                   self._degraded, lambda: self.state == State.LIVE, self._emit, self._spawn,
                                   clock, partial_pacer(settings, spec, self.policy))
        self.budget = AudioBudget(settings.limits.max_audio_speed, settings.limits.max_audio_burst_s, time.monotonic)
        self.ingest = AudioIngest(spec, self.timeline, self.policy, self.jobs, arrivals, self.decisions.apply,
                                  lambda: self.state == State.CLOSED, self._emit, self._spawn, self.budget, trace)
        self.images = Images(self.jobs, settings, self.image_slots, self._place, self._degraded, self._new_video,
                             self._attach_vocabulary, self._emit, self._spawn,
                             pixels or pixel_budget(settings.limits, time.monotonic), trace)

    @property
    def seq(self) -> int:
        """The last final's number (sent, or logged before a resume)."""
        return self.finals.seq

    @property
    def tap(self) -> Callable[[Event], None] | None:
        """Sees every event the session emits, first (a room's publisher: rooms/publisher.py); never blocks."""
        return self.outbox.tap

    @tap.setter
    def tap(self, tap: Callable[[Event], None] | None) -> None:
        self.outbox.tap = tap

    @property
    def video(self) -> StreamVideo | None:
        """stream/video.py StreamVideo, made by the first ``frame`` message."""
        return self.images.video

    @property
    def frames_dropped(self) -> int:
        """Image frames not read because the class was degraded."""
        return self.images.frames_dropped

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
        """Go live. Returns the ``ready`` event (with what a resuming client needs to re-send). A session ended while
        it opened (a drain, its key revoked, shedding: while ``open`` waited on the stream log) raises why."""
        if self.state == State.CLOSED:
            raise self.error or BackendError("the stream was closed while it opened; open it again")
        resumed: ResumedJSON | None = None
        if self._resume is not None:
            point = ResumePoint.of(self._resume)
            self.finals.seq = point.last_seq
            if self.journal is not None:
                self.journal.logged_seq = point.last_seq
                self.journal.epoch = point.epoch
            self._text_until = point.text_until
            if point.origin is not None:
                self.timeline.origin = point.origin
            self.timeline.start = self.timeline.end = int(round(point.committed_until * SR))
            self.ingest.vad_pos = self.timeline.start
            self.policy.committed(point.committed_until)
            if self.jobs.speakers is not None:  # the labels and names so far go on
                self.jobs.speakers.restore(self._resume.get("speakers"))
            resumed = point.resumed()
        self._to(State.LIVE)
        self._emitter = asyncio.create_task(self._emit_finals(), name=f"emit:{self.spec.stream_id}")
        self.ingest.start()
        return Ready(stream_id=self.spec.stream_id, resume_token=self.spec.resume_token, slo=self.spec.slo,
                     source_lang=AUTO if self.spec.detects else self.spec.source_lang, targets=self.spec.targets,
                     partials=self.spec.partials, source_langs=list(self.spec.source_langs) or None,
                     resumed=resumed, max_audio_speed=self.budget.speed, max_audio_burst_s=self.budget.burst_s,
                     scripts=self.spec.scripts(), max_speakers=self.spec.max_speakers or None,
                     speaker_names=dict(self.jobs.speakers.names) if self.jobs.speakers is not None else None)

    def _spawn(self, coro: Coroutine[object, object, T], name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def outgoing(self) -> AsyncIterator[Event]:
        """What the client is sent, in order, until the stream ends: every queued event through ``closed``; a
        session that ended without one (slow consumer, shed, drain) gives what was queued, then the error saying
        why. The WebSocket writer and in-process streams both read this."""
        return self.outbox.outgoing(self.closed, lambda: self.error)

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

    def _degraded(self, step: str) -> bool:
        return self.owner.degraded(self.spec.slo, step, self.spec.key_id)

    async def feed_audio(self, pcm16: bytes, ts: object = None) -> None:
        """PCM16 LE mono 16 kHz bytes, or a piece of the WebM/Ogg stream when the stream declared one."""
        self._live("audio")
        await self.ingest.feed(pcm16, check_ts(ts))

    def rename_speaker(self, speaker: object, name: object) -> None:
        """Give a ``diarize`` stream's speaker ("S1") a display name: ``speaker_renamed``, and later finals carry it
        as ``speaker_name`` (a room's listeners see both)."""
        if self.state not in (State.LIVE, State.DRAINING):
            raise InvalidParameter("the stream is not live")
        if self.jobs.speakers is None:
            raise InvalidParameter("rename_speaker names a speaker: start the stream with diarize: true",
                                   details={"field": "diarize"})
        self._emit(self.jobs.speakers.rename(speaker, name))

    def _queue(self, job: Coroutine[object, object, Final | None]) -> None:
        self.finals.queue(job)

    def _place(self, modality: str, ts: float | None) -> float:
        """Stream time of a non-audio item: its media timestamp, corrected for that modality's clock skew. The
        first timestamped item of any modality fixes the stream's clock origin (a text-only stream has no audio)."""
        if ts is None:
            return self.timeline.end_s
        if self.timeline.origin is None:
            self.timeline.origin = ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.end_s
        return max(0.0, ts + self.spec.clock_offsets.get(modality, 0.0) - self.timeline.origin)

    async def feed_text(self, text: str, ts: object = None) -> None:
        self._live("text")
        ts = check_ts(ts)
        limit = self.settings.limits.max_text_chars
        if len(text) > limit:  # as on REST: one message cannot hold a model worker for seconds
            raise TooLarge(f"a text message has at most {limit} characters (this one {len(text)}); split it",
                           details={"limit": "max_text_chars"})
        t = self._place("text", ts)
        if ts is not None and t <= self._text_until + 1e-6:
            return  # re-sent after a resume, and its caption was logged before the break: not again
        self._queue(self.jobs.translate_text(text.strip(), t, time.monotonic()))

    async def feed_image(self, data: bytes, ts: object = None) -> None:
        self._live("image")
        await self.images.feed_image(data, check_ts(ts))

    async def feed_frame(self, data: bytes, ts: object = None) -> None:
        """One video frame (png / jpeg / webp) at media time ``ts``: every frame goes through the slide change
        detector, OCR and MT run only when the picture changed (stream/video.py)."""
        self._live("video")
        await self.images.feed_frame(data, check_ts(ts))

    def _new_video(self) -> StreamVideo:
        from .video import StreamVideo

        return StreamVideo(self.jobs, self._emit, self._spawn, lambda: self.state != State.CLOSED,
                           self.settings.limits, self.image_slots, owner=self)

    async def _attach_vocabulary(self, video: StreamVideo) -> None:
        vocabularies = self.owner.vocabularies
        if self.spec.vocabulary_id and vocabularies is not None:  # signs (or lips, with speech) too
            await vocabularies.attach(video, self.spec, self.jobs, self._emit, self._spawn, queue=self._queue,
                                      heard=self._heard)

    async def logged_finals_after(self, seq: int) -> list[FinalJSON]:
        """The finals this stream's log holds after ``seq``, as sent (a resumed room publisher's catch-up,
        rooms/service.py); [] for a stream without a log."""
        if self.journal is None:
            return []
        return await self.journal.log.finals_after(self.spec.stream_id, seq)

    def _heard(self) -> tuple[float, float | None, bool]:
        """For lips (vision/stream_lips.py): audio heard by the VAD until (stream s), the open speech's start."""
        return self.ingest.heard()

    async def end(self) -> None:
        """The client finished sending: flush pending speech, let every committed caption out, then close."""
        if self.state != State.LIVE:
            return
        self._to(State.DRAINING)
        await self.ingest.finish()
        if self.video is not None:  # the last slide shown, and slides still being read, go out before closed
            await self.video.finish(self.settings.server.drain_timeout_s)
            if self.spec.vocabulary_id and self.owner.vocabularies is not None:  # and a sign still being made
                await self.owner.vocabularies.finish(self.video, self.settings.server.drain_timeout_s)
        flush = self.policy.flush(self.timeline.end_s)
        self.decisions.apply(flush)
        if flush.kind == "commit":
            self.policy.committed(flush.end)
        await self.finals.end()

    def busy(self) -> bool:
        """Committed work not yet sent or not yet logged (a drain waits for it)."""
        return bool(self._pending.qsize() or self.finals.holding or (self.journal is not None and self.journal.pending)
                    or any(t.get_name() == "commit" and not t.done() for t in self._tasks))

    def release_held(self) -> None:
        """The server drains: a caption held for its sentence's end (stream/finals.py) is translated and sent now."""
        self.finals.release()

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
        self.ingest.abort()
        if self._emitter is not None and self._emitter is not asyncio.current_task():
            self._emitter.cancel()
        self.owner.released(self)
        self.closed.set()

    async def _emit_finals(self) -> None:
        try:
            unlogged = await self.finals.run(self.settings.server.drain_timeout_s)
            tl = self.timeline.stats
            self._emit(Closed(finals=self.seq, unlogged=unlogged or None, frames_dropped=self.frames_dropped,
                              video=self.video.stats() if self.video is not None else None,
                              timeline={"late_dropped": tl.late_dropped, "reordered": tl.reordered,
                                        "overlapped": tl.overlapped, "gap_seconds": round(tl.gap_seconds, 3)}))
        except TakenOver as exc:  # resumed elsewhere while this one ended: not closed by this session (journal.py)
            self.error = exc
        except Exception as exc:  # a bug in a caption's work (an error no stage typed): logged, and the client told
            # (`internal`, 1011) instead of a quiet close without `closed` and the captions after it lost unsaid
            log.exception("stream %s: its finals failed", self.spec.stream_id)
            if self.error is None:
                self.error = LinguaFusionError(f"finals failed: {type(exc).__name__}: {exc}")
        finally:
            self.state = State.CLOSED
            self.owner.released(self)
            self.closed.set()
