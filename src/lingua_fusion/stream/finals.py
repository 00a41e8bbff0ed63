"""A stream's finals, in input order: commit jobs are queued (bounded: too many pending closes the stream) and
awaited one by one; each final is numbered 1, 2, 3, ... with no gaps, logged (stream/journal.py), timed, sent with
its metrics, then spoken when the stream asked for speech. On a ``diarize`` stream each final is labelled with its
speaker as it is taken, in input order (stream/speakers.py), and named as it is sent.

Whole sentences for MT. The commit policy (stream/policy.py) ends an utterance at a pause or, when the speaker goes
on, at ``max_utterance_s``. A length cut usually falls inside a sentence ("... ask her to bring these" | "things
with her from the store."), and MT given either piece alone translates neither right. So a final cut by length is
held: its words are known, its translation waits for the next final (``waits``: at most one more, and at most the
class's ``sentence_hold_s``). When that one goes on with the sentence (``joins``: the held words have no final
punctuation, or the next ones start in lower case: Whisper's full stop at the cut), the two are translated as one
text and the translation is cut back onto both (``share``: each piece sized like its share of the source,
lingua_fusion/sentences.py ``spread``), and they go out together, in order. Otherwise, or when nothing comes in
time (the speaker stopped, the stream ended, a drain: ``release``), the held one is translated alone, and says so
(``open_note``) when its sentence was left open. Those decisions (``Heard`` to ``add_note``) are pure functions.
Nothing is logged before it is sent, so a held final lost with the process is captioned again on resume (its audio
is after ``committed_until``)."""

from __future__ import annotations

import asyncio
import base64
import enum
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from ..errors import LinguaFusionError, Overloaded, StoreUnavailable
from ..sentences import continues, ends_sentence, join, spread
from ..tracing import TraceRef, span
from .contracts import Emit, Spawn
from .events import Error, Final, Metrics, Speech
from .ingest import AudioTimeline
from .jobs import StreamJobs
from .journal import Journal
from .protocol import StreamSpec

# ---- whole sentences (pure) --------------------------------------------------------------------------------------
MAX_GROUP = 2  # a held caption waits for one more at most: its latency stays bounded


@dataclass(frozen=True)
class Heard:
    """What the decision reads of a final: its words, why its utterance ended, whether it is speech, its language
    (a "auto" stream's speaker may switch at a cut: two languages are not one sentence)."""

    text: str
    cut: str = "pause"
    speech: bool = True
    lang: str = ""
    speaker: str = ""  # a ``diarize`` stream's label: two speakers' words are not one sentence

    @classmethod
    def of(cls, final: Final) -> Heard:
        return cls(final.source_text, final.cut, final.modality == "audio", final.source_lang or "",
                   final.speaker or "")


def waits(group: Sequence[Heard], max_group: int = MAX_GROUP) -> bool:
    """Does the group's translation wait for the next final? Its last utterance had words and was cut at the
    length limit while the speaker went on, and the group may still grow."""
    last = group[-1]
    return last.speech and last.cut == "length" and bool(last.text.strip()) and len(group) < max_group


def joins(group: Sequence[Heard], nxt: Heard) -> bool:
    """Does ``nxt`` go on with the sentence the group left open? Speech in the same language (and by the same
    speaker, on a ``diarize`` stream) with words after a piece without final punctuation, or speech that starts in
    lower case (the full stop before it was put there at the cut)."""
    last = group[-1]
    return nxt.speech and bool(nxt.text.strip()) and nxt.lang == last.lang and nxt.speaker == last.speaker and (
        not ends_sentence(last.text) or continues(nxt.text))


def open_note(group: Sequence[Heard], why: str) -> str | None:
    """What a group translated with its sentence still open says (``why`` it was not completed); None when its
    last words end a sentence."""
    if ends_sentence(group[-1].text):
        return None
    return f"cut at the maximum utterance length mid-sentence, and translated before the sentence ended: {why}"


def share(group: Sequence[Final], whole: Final) -> None:
    """Cut ``whole`` (the group's words translated as one text) back onto the group's finals: each target's
    translation spread by each final's share of the source; the failures, notes, slides and route marks of that
    one translation go with every piece, and each untranslated word with the piece that holds it (else the last)."""
    weights = [len(f.source_text.strip()) for f in group]
    pieces = {t: spread(text, weights, t) for t, text in whole.translations.items()}
    first = next(iter(whole.translations), None)  # the stream's first target (whole.text)
    for i, f in enumerate(group):
        f.translations = {t: p[i] for t, p in pieces.items()}
        f.text = f.translations[first] if first is not None else ""
        f.failed, f.note, f.low_confidence = whole.failed, whole.note, whole.low_confidence
        f.slides, f.slide_terms = list(whole.slides), list(whole.slide_terms)
        f.latency_ms = {**f.latency_ms, "mt": whole.latency_ms.get("mt", 0.0)}
        f.untranslated = None
    for target, words in (whole.untranslated or {}).items():
        for word in words:
            owner = next((f for f in group if word in f.translations.get(target, "")), group[-1])
            owner.untranslated = owner.untranslated or {}
            owner.untranslated.setdefault(target, []).append(word)


def add_note(final: Final, note: str | None) -> None:
    if note:
        final.note = f"{final.note}; {note}" if final.note else note


# ---- the emitter -------------------------------------------------------------------------------------------------
class Mark(enum.Enum):
    END = "end"  # no more jobs
    LATE = "late"  # the next job was not done in time (or a hold was released): it stays first in line


T = TypeVar("T")
Result = Final | Error | None  # what a job comes to: its final, its error, or nothing said
Job = asyncio.Task[Final | None]


class Finals:
    def __init__(self, spec: StreamSpec, jobs: StreamJobs, journal: Journal | None, timeline: AudioTimeline,
                 caption_done: Callable[[float], None], fail: Callable[[LinguaFusionError], None], emit: Emit,
                 spawn: Spawn, trace: TraceRef | None = None) -> None:
        self.spec = spec
        self.jobs = jobs
        self.journal = journal
        self.timeline = timeline  # its origin goes into the log with each final
        self._caption_done = caption_done  # a final went out this many seconds after its words arrived
        self._fail = fail
        self._emit = emit
        self._spawn = spawn
        self.trace = trace
        self.pending: asyncio.Queue[Job | None] = asyncio.Queue(maxsize=64)
        self.seq = 0
        self.holding = False  # a final waits for the next one to finish its sentence
        self._ahead: Job | None = None  # taken from ``pending`` and not done in time: first in line
        self._back: Result = None  # a result taken that was not the held sentence's end: first in line
        self._ended = False  # the end was taken from ``pending``
        self._released = asyncio.Event()

    def queue(self, job: Coroutine[object, object, Final | None]) -> None:
        task = self._spawn(job, "commit")
        try:
            self.pending.put_nowait(task)
        except asyncio.QueueFull:
            task.cancel()
            # the server's own backlog (commit jobs not yet translated), not a client that stopped reading (that is
            # the Outbox's slow_consumer): the stream sends input faster than it is captioned
            self._fail(Overloaded(f"too many captions pending ({self.pending.maxsize}): this stream sends input "
                                  "faster than the server can caption it; send less often and resume",
                                  retry_after=1.0))

    async def end(self) -> None:
        """No more jobs: ``run`` returns once the queued ones are sent."""
        await self.pending.put(None)

    def release(self) -> None:
        """Hold no final any longer (the server drains): a held one is translated as it stands and sent."""
        self._released.set()

    async def run(self, drain_timeout_s: float) -> int:
        """Send every queued job's final until ``end``; then wait for the log (at most ``drain_timeout_s``).
        Returns how many finals were sent but not logged."""
        while (item := await self._take()) is not Mark.END:
            if isinstance(item, Error):
                self._emit(item)
            elif isinstance(item, Final):
                group, base = await self._whole(item), self.seq
                for final in group:
                    if len(group) > 1:
                        final.sentence = list(range(base + 1, base + 1 + len(group)))
                    await self._send(final)
        if self.journal is None:
            return 0
        return await self.journal.finish(drain_timeout_s)

    async def _take(self, wait_s: float | None = None) -> Result | Mark:
        """The next job's result, in input order; END when there are no more jobs. With ``wait_s``: LATE when it
        is not done within that, or a hold is released first (it stays first in line)."""
        if self._back is not None:
            back, self._back = self._back, None
            return back
        loop = asyncio.get_running_loop()
        until = None if wait_s is None else loop.time() + wait_s
        if self._ahead is None and not self._ended:
            if until is None:
                self._ahead = await self.pending.get()
            else:
                getter = asyncio.ensure_future(self.pending.get())
                if not await self._within(getter, until):
                    getter.cancel()  # the queue keeps an item that came meanwhile
                    return Mark.LATE
                self._ahead = getter.result()
            self._ended = self._ahead is None
        job = self._ahead
        if job is None:
            return Mark.END
        if until is not None and not await self._within(job, until):
            return Mark.LATE
        self._ahead = None
        try:
            result = await job
        except LinguaFusionError as exc:
            return Error(exc.code, exc.public_message)
        if isinstance(result, Final) and self.jobs.speakers is not None:
            self.jobs.speakers.label(result)  # here, in input order: speakers are named as they appear
        return result

    async def _within(self, fut: asyncio.Future[T], until: float) -> bool:
        """Is ``fut`` done by loop time ``until``, and before a ``release``?"""
        released = asyncio.ensure_future(self._released.wait())
        either: set[asyncio.Future[T] | asyncio.Future[Literal[True]]] = {fut, released}
        try:
            await asyncio.wait(either, timeout=max(0.0, until - asyncio.get_running_loop().time()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
        return fut.done()

    async def _whole(self, first: Final) -> list[Final]:
        """``first``, and when it was cut at the length limit, the next final if that one goes on with its
        sentence, translated together (stream/py); a result that does not join stays first in line."""
        group, heard = [first], [Heard.of(first)]
        if not waits(heard):
            return group
        hold, t0 = self.spec.policy.sentence_hold_s, time.monotonic()
        self.holding = True
        try:
            while waits(heard):
                nxt = await self._take(hold - (time.monotonic() - t0))
                if isinstance(nxt, Final) and joins(heard, Heard.of(nxt)):
                    group.append(nxt)
                    heard.append(Heard.of(nxt))
                    continue
                why = _why(nxt, hold, self._released.is_set())
                if not isinstance(nxt, Mark):
                    self._back = nxt
                break
            else:
                why = f"it was still open after {len(group)} captions"
        finally:
            self.holding = False
        lang = first.source_lang or self.spec.source_lang  # the group's: a final in another language does not join
        try:
            whole = await self.jobs.translate(join([f.source_text for f in group], lang), first.start, group[-1].end,
                                              confidence=min(f.confidence for f in group), wall_ref=first.wall_ref,
                                              lang=lang)
        except LinguaFusionError as exc:  # (overloaded): the captions still go out, numbered, with their words
            targets = list(self.spec.targets)
            whole = Final(start=first.start, end=group[-1].end, source_text="", text="",
                          translations={t: "" for t in targets}, confidence=0.0,
                          failed=[f"mt:{t}" for t in targets if t != lang] or None,
                          note=f"translation failed: {exc.public_message}")
        if whole is not None:
            share(group, whole)
        add_note(group[-1], open_note(heard, why))
        first.latency_ms["held"] = round((time.monotonic() - t0) * 1000, 1)
        return group

    async def _send(self, final: Final) -> None:
        self.seq += 1
        final.seq = self.seq
        speakers = self.jobs.speakers
        if speakers is not None:
            speakers.name(final)
        if self.journal is not None:
            if self.journal.full:
                final.durable = False
                self._fail(StoreUnavailable("the stream log has been unavailable too long; the stream was closed"))
                return
            with span(self.trace, "journal.write", seq=final.seq) as write:  # the speakers ride in the snapshot
                await self.journal.append(final, self.timeline.origin,
                                          speakers.state() if speakers is not None else None)
                if write is not None:
                    write.set(durable=final.durable is not False)  # False: sent before the log had it
        latency = time.monotonic() - final.wall_ref
        final.latency_ms["caption"] = round(latency * 1000, 1)
        # the SLO breaker hears the server's lateness, not the time a held caption waited for the speaker's words
        self._caption_done(latency - final.latency_ms.get("held", 0.0) / 1000)
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


def _why(nxt: Result | Mark, hold_s: float, released: bool) -> str:
    """Why a held final's sentence was not finished by ``nxt``."""
    if nxt is Mark.END:
        return "the stream ended"
    if nxt is Mark.LATE:
        return "the server is draining" if released else f"no more speech came within {hold_s:g} s"
    if isinstance(nxt, Final) and nxt.modality != "audio":
        return "the next caption was not speech"
    return "the next utterance failed" if isinstance(nxt, Error) else "no more words came"
