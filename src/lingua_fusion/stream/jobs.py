"""A stream's model jobs over the ModelPort: partial re-decodes, commits (on a ``source_lang: "auto"`` stream the
utterance's language first, stream/languages.py; then ASR in that language -> confidence gate -> MT per target from
it), text translations, slides (OCR) and speech. Each returns what it made; the session decides what to do with it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from .. import langs
from ..errors import BackendError, NotConfigured, Overloaded
from ..glossary import Term
from ..models.transcript_guard import to_script
from ..serving.keys import ModelKey
from ..serving.ports import AsrInput, AsrOutput, CallContext, DetectInput, ModelPort, MtInput, TranscribeInput
from ..tracing import TraceRef
from ..untranslated import strip_marks
from ..untranslated import warning as untranslated_warning
from .events import Final
from .languages import Detection, decide
from .protocol import StreamSpec
from .speakers import StreamSpeakers
from .wire import WordJSON

MAX_SLIDES = 32  # slides a stream remembers (their words are ASR context and MT names)
MAX_WORDS = 512  # words a final lists (an utterance is at most its class's maximum length: far fewer)
MT_PIECE_CHARS = 1000  # a caption's text goes to MT in pieces of at most this many characters (at sentence ends)
T = TypeVar("T")
SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


@dataclass(frozen=True)
class Tentative:
    """A partial re-decode's result: the source text and its tentative translation into the first target."""

    text: str
    confidence: float
    translation: str


@dataclass(frozen=True)
class Shed:
    """A partial the engine shed or refused (past its deadline, its queue or pool full, its backend failing):
    nothing to show, and a sign of load the stream's pacer backs off on (stream/policy.py ``PartialPacer``)."""


class Fused(Protocol):
    """An utterance's caption fused from speech and lips (vision/fusion.py ``FusedCaption``)."""

    @property
    def text(self) -> str: ...
    @property
    def confidence(self) -> float: ...
    @property
    def modalities(self) -> Sequence[str]: ...  # what made it: "audio", "lips"
    @property
    def replaced(self) -> Sequence[Sequence[str]]: ...  # (heard word, lip-read word) pairs


class Lips(Protocol):
    """A lip vocabulary's evidence on a stream (vision/stream_lips.py ``StreamLips``), fused into its finals."""

    def claim(self, start: float, end: float) -> None:
        """This utterance's lip movements are fused into its final, not captioned on their own."""
        ...

    async def fuse(self, text: str, confidence: float, start: float, end: float) -> Fused | None: ...


class StreamJobs:
    def __init__(self, spec: StreamSpec, port: ModelPort, trace: TraceRef | None = None) -> None:
        self.spec = spec
        self.port = port
        self.trace = trace  # the stream's span (tracing on): every model call's span is its child
        self.slides: list[tuple[float, str]] = []  # (stream time, OCR text), oldest first
        self.glossary = tuple(spec.glossary)  # one tuple for the stream's life: the MT thread compiles it once
        self.lips: Lips | None = None  # set by vision/ when the stream's vocabulary reads lips
        self.heard_lang: str | None = None  # a "auto" stream's last surely detected language
        self.speakers: StreamSpeakers | None = None  # a ``diarize`` stream's (stream/speakers.py), set by the session
        self._words_off = False  # a ``word_timestamps`` stream on a recogniser that cannot time words

    @property
    def lang(self) -> str:
        """The language partials are decoded in: the given one, or on a "auto" stream the last one heard surely
        (before any, the first candidate): a partial is not worth a detection of its own."""
        return self.heard_lang or self.spec.source_lang

    def committed(self, start: float) -> CallContext:
        """The context of committed work for words that arrived at ``start``."""
        return self._ctx(False, start)

    def _ctx(self, tentative: bool, start: float | None = None) -> CallContext:
        return CallContext(self.spec.stream_id, self.spec.slo, self.spec.importance, tentative, start,
                           key_id=self.spec.key_id, trace=self.trace)

    def heard(self, text: str, lang: str | None = None) -> str:
        """A transcript in the script the stream's source tag asked for (Whisper writes Mandarin in either); Mandarin
        detected on a "auto" stream whose first language is not Chinese in Simplified characters."""
        script = self.spec.source_script if (lang or self.spec.source_lang) == self.spec.source_lang else (
            "Hans" if lang == "zh" else None)
        return to_script(text, script) if script and text else text

    def written(self, text: str, target: str) -> str:
        """A caption in ``target``'s script (zh-TW: Traditional; the MT engines write Simplified)."""
        script = self.spec.target_scripts.get(target)
        return to_script(text, script) if script and text else text

    def model_keys(self) -> list[ModelKey]:
        """The model keys this stream uses now (for its metrics events): a "auto" stream's detection and its
        current language's, a ``diarize`` stream's speaker embeddings."""
        src = self.lang
        return ([ModelKey.detect()] if self.spec.detects else []) + [ModelKey.asr(src)] + [
            ModelKey.mt(src, t) for t in self.spec.targets if t != src] + (
            [ModelKey.spk()] if self.speakers is not None else [])

    async def vad(self, audio: np.ndarray) -> np.ndarray:
        probabilities: np.ndarray = await self.port.run(ModelKey.vad(), np.ascontiguousarray(audio), self._ctx(False))
        return probabilities

    async def partial(self, audio: np.ndarray, current: Callable[[], bool]) -> Tentative | Shed | None:
        """Re-decode the utterance so far. ``Shed`` when the engine shed, refused or failed it; None when no longer
        ``current``, and when it heard no words or its confidence is under the stream's ``min_confidence``: what
        the final's gate would withhold is not shown tentatively either (music, applause: Whisper's guesses at them
        stay unsaid)."""
        src = self.lang
        try:
            res: AsrOutput | None = await self.port.run(ModelKey.asr(src), AsrInput(audio, self._prompt()),
                                                        self._ctx(True))
            if res is None:
                return Shed()
            if not current() or not res.text.strip() or res.confidence < self.spec.min_confidence:
                return None
            text, target = self.heard(res.text, src), self.spec.targets[0]
            translation = text
            if text and target != src:
                # a tentative translation of the tentative text: shed first under load, like the re-decode itself
                out = await self.port.run(ModelKey.mt(src, target),
                                          MtInput(text, self.glossary), self._ctx(True))
                if out is None:
                    return Shed()
                if not current():
                    return None
                translation = str(out)
        except (BackendError, Overloaded):  # tentative: never retried, never an error the stream sees
            return Shed()
        return Tentative(text, res.confidence, self.written(translation, target))

    async def commit(self, audio: np.ndarray, start: float, end: float, wall_ref: float,
                     cut: str = "pause") -> Final | None:
        """A committed utterance -> its final (unnumbered), or None when it held no words. ``cut``: why the policy
        ended it; one cut at the maximum length (``"length"``) comes back untranslated: its sentence may go on in the
        next utterance, and the emitter translates them together (stream/finals.py). On a "auto" stream its
        language is detected first, and it is transcribed and translated in that language. On a ``diarize`` stream
        its voice is embedded beside all that (the final's ``voice``: the emitter labels it, in order)."""
        if self.speakers is None:
            return await self._heard(audio, start, end, wall_ref, cut)
        final, voice = await asyncio.gather(self._heard(audio, start, end, wall_ref, cut),
                                            self.speakers.embed(audio, wall_ref))
        if final is not None:
            final.voice = voice
        return final

    async def _heard(self, audio: np.ndarray, start: float, end: float, wall_ref: float, cut: str) -> Final | None:
        """``commit`` without the speaker."""
        if not self.spec.detects:
            return await self._commit(audio, start, end, wall_ref, cut, self.spec.source_lang)
        t0 = time.monotonic()
        detection, failure = await self._detect(audio, wall_ref)
        detect_ms = (time.monotonic() - t0) * 1000  # what detecting the language added to the caption's latency
        final = await self._commit(audio, start, end, wall_ref, cut, detection.lang)
        if final is not None:
            final.source_lang = detection.lang
            final.source_lang_confidence = detection.confidence
            final.source_lang_unsure = detection.unsure or None
            final.latency_ms["detect"] = round(detect_ms, 1)
            for note in (failure, detection.note(self.spec.source_langs) if failure is None else None):
                if note:
                    final.note = f"{final.note}; {note}" if final.note else note
        return final

    async def _detect(self, audio: np.ndarray, wall_ref: float) -> tuple[Detection, str | None]:
        """The utterance's language (stream/languages.py ``decide``), and a note when the detection failed (after
        its retries: then the stream's previous language, unsure). A sure one becomes the stream's language."""
        failure = None
        try:
            probs = await self.port.run(ModelKey.detect(), DetectInput(audio, tuple(self.spec.source_langs)),
                                        self._ctx(False, wall_ref))
        except BackendError as exc:
            probs, failure = None, f"language detection failed ({exc.public_message}): kept {self.lang}"
        detection = decide(probs or {}, self.heard_lang, self.spec.source_lang)
        if not detection.unsure:
            self.heard_lang = detection.lang
        return detection, failure

    async def _commit(self, audio: np.ndarray, start: float, end: float, wall_ref: float, cut: str,
                      lang: str) -> Final | None:
        """``commit`` in a known language ``lang``."""
        def empty(confidence: float, note: str, *, failed: list[str] | None = None,
                  gated: list[str] | None = None) -> Final:  # a final over this span with nothing in it but a note
            return Final(start=round(start, 3), end=round(end, 3), source_text="", text="",
                         translations={t: "" for t in self.spec.targets}, wall_ref=wall_ref, source_lang=lang,
                         confidence=confidence, failed=failed, gated=gated, note=note)
        lips = self.lips
        if lips is not None:
            lips.claim(start, end)  # this utterance's lip movements are fused here, not captioned on their own
        words: list[WordJSON] = []
        try:
            if self.spec.word_timestamps and not self._words_off:
                res, words = await self._timed(audio, lang, start, wall_ref)
            else:
                res = await self.port.run(ModelKey.asr(lang), AsrInput(audio, self._prompt()),
                                          self._ctx(False, wall_ref))
        except BackendError as exc:
            # retried and still failing: the span gets a final that says so, keeping the numbering gap-free
            return empty(confidence=0.0, failed=["asr"],
                         note=f"speech recognition failed: {exc.public_message}")
        asr_ms = (time.monotonic() - wall_ref) * 1000
        if res is not None:
            res = AsrOutput(self.heard(res.text, lang), res.confidence)
        fused = None if lips is None else await lips.fuse(res.text if res else "", res.confidence if res else 0.0,
                                                          start, end)
        if fused is not None and "audio" not in fused.modalities:  # unsure or no speech: what the lips said
            return await self._fused(fused, start, end, wall_ref, asr_ms, lang)
        if res is None or not res.text.strip():
            return None
        if res.confidence < self.spec.min_confidence:
            return empty(confidence=res.confidence, gated=["asr"],
                         note=f"speech confidence {res.confidence:.2f} below {self.spec.min_confidence}")
        if fused is not None and "lips" in fused.modalities:  # confirmed, re-ranked or corrected by the lips
            return await self._fused(fused, start, end, wall_ref, asr_ms, lang)
        if cut == "length":  # heard, not yet translated
            return Final(start=round(start, 3), end=round(end, 3), source_text=res.text, text="", translations={},
                         confidence=res.confidence, latency_ms={"asr": round(asr_ms, 1)}, wall_ref=wall_ref,
                         cut=cut, scripts=self.spec.scripts(), source_lang=lang, words=words or None)
        final = await self.translate(res.text, start, end, confidence=res.confidence, wall_ref=wall_ref,
                                     asr_ms=asr_ms, lang=lang)
        if final is not None:
            final.cut = cut
            final.words = words or None
            if self.spec.word_timestamps and self._words_off:
                final.note = "; ".join(n for n in (final.note, "no word times: this server's speech recogniser "
                                                   "cannot time words") if n)
        return final

    async def _timed(self, audio: np.ndarray, lang: str, start: float,
                     wall_ref: float) -> tuple[AsrOutput | None, list[WordJSON]]:
        """A ``word_timestamps`` stream's utterance: Whisper's segments with their words (the files' request on the
        same model key, so it batches with them), as the utterance's text and its words in stream seconds (at most
        MAX_WORDS). A recogniser that cannot time words (the torch port: NotConfigured) turns them off for the
        stream, with a note on the final after; the text is decoded as usual."""
        try:
            out = await self.port.run(ModelKey.asr(lang), TranscribeInput(audio, lang, prompt=self._prompt(),
                                                                          word_timestamps=True),
                                      self._ctx(False, wall_ref))
        except NotConfigured:
            self._words_off = True
            res = await self.port.run(ModelKey.asr(lang), AsrInput(audio, self._prompt()), self._ctx(False, wall_ref))
            return res, []
        if out is None:
            return None, []
        segments = out.segments
        text = " ".join(s.text.strip() for s in segments).strip()
        confidence = min((s.confidence for s in segments), default=0.0)
        words = [WordJSON(word=w.word.strip(), start=round(start + w.start, 3), end=round(start + w.end, 3))
                 for s in segments for w in s.words if w.word.strip()][:MAX_WORDS]
        return AsrOutput(text, confidence), words

    async def _fused(self, fused: Fused, start: float, end: float, wall_ref: float, asr_ms: float,
                     lang: str) -> Final | None:
        """A final from ``vision.fusion.fuse``'s caption, saying which modalities made it (an utterance's span:
        it moves the audio cursor of the log whatever made its text)."""
        final = await self.translate(fused.text, start, end, confidence=fused.confidence, wall_ref=wall_ref,
                                     asr_ms=asr_ms, lang=lang)
        if final is not None:
            final.modalities = list(fused.modalities)
            final.replaced = [list(p) for p in fused.replaced] or None
        return final

    async def translate_text(self, text: str, t: float, wall_ref: float) -> Final | None:
        """A text message's final. On a "auto" stream its language is the text identifier's when that is sure and
        a candidate (a typed question need not be in the language being spoken), else the stream's current one."""
        lang = await asyncio.to_thread(self.text_lang, text) if self.spec.detects else self.spec.source_lang
        return await self.translate(text, t, t, confidence=1.0, wall_ref=wall_ref, modality="text", lang=lang)

    def text_lang(self, text: str) -> str:
        """See ``translate_text`` (py3langid: loaded on first use, so called off the event loop)."""
        guess = langs.identify(text)
        return guess.lang if guess.sure and guess.lang in self.spec.source_langs else self.lang

    async def translate(self, text: str, start: float, end: float, *, confidence: float, wall_ref: float,
                        asr_ms: float = 0.0, modality: str = "audio", lang: str | None = None) -> Final | None:
        """``text`` (in ``lang``, by default the stream's source language) -> a final translated into every
        target; a target in the text's own language gets the text itself."""
        if not text:
            return None
        src = lang or self.spec.source_lang
        t0 = time.monotonic()
        slide_terms = self._slide_terms(text)
        failed: list[str] = []
        notes: list[str] = []

        async def one(target: str) -> str:
            if target == src:
                return self.written(text, target)
            key, names, ctx = ModelKey.mt(src, target), tuple(slide_terms), self._ctx(False, wall_ref)
            try:  # a long text in pieces: each is a work item, so another key's caption waits for one piece at most
                outs = await each([self.port.run(key, MtInput(piece, self.glossary, names), ctx)
                                    for piece in pieces(text, MT_PIECE_CHARS)])
            except BackendError as exc:  # retried and still failing: the source text stays, the target is empty
                failed.append(f"mt:{target}")
                notes.append(f"translation to {target} failed: {exc.public_message}")
                return ""
            translated, words = strip_marks(" ".join(str(o or "") for o in outs))
            if words:
                unknown[target] = words
                notes.append(untranslated_warning(words, target))
            return self.written(translated, target)

        unknown: dict[str, list[str]] = {}
        targets = list(self.spec.targets)  # read once: a room may add a language while this caption translates
        outs = await each([one(t) for t in targets])
        translations = dict(zip(targets, outs, strict=True))
        slides = [s for t, s in self.slides if start - 0.5 <= t <= end] or ([self.slides[-1][1]] if self.slides
                                                                              else [])
        return Final(start=round(start, 3), end=round(end, 3), source_text=text,
                     text=translations[targets[0]], translations=translations, confidence=confidence,
                     slides=slides, slide_terms=[t.source for t in slide_terms],
                     latency_ms={"asr": round(asr_ms, 1), "mt": round((time.monotonic() - t0) * 1000, 1)},
                     failed=sorted(failed) or None, note="; ".join(notes) or None, wall_ref=wall_ref,
                     modality=modality, low_confidence=self._low_confidence(translations, src) or None,
                     untranslated=unknown or None, scripts=self.spec.scripts(), source_lang=src)

    def _low_confidence(self, translations: dict[str, str], src: str) -> list[str]:
        """The targets of this final that the tiny LLM translated (their route from ``src`` is low-confidence)."""
        return [t for t in self.spec.low_targets(src) if translations.get(t)]

    async def read_slide(self, image: np.ndarray, t: float) -> str | None:
        """OCR a frame (tentative work: shed under load). Raises BackendError when the OCR backend fails."""
        lines = await self.port.run(ModelKey.ocr(), image, self._ctx(True))
        if not lines:
            return None
        text = " ".join(ln.text for ln in lines)
        self.slides.append((t, text))
        del self.slides[:-MAX_SLIDES]
        return text

    async def speak(self, text: str, lang: str) -> bytes | None:
        wav: bytes | None = await self.port.run(ModelKey.tts(lang), text, self._ctx(False))
        return wav

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


async def each(calls: list[Coroutine[object, object, T]]) -> list[T]:
    """The calls' results in order. One (a caption into one target, in one piece: the common case) is awaited
    right here, in the caller's task; several run at once, a task each (``asyncio.gather``)."""
    if len(calls) == 1:
        return [await calls[0]]
    return list(await asyncio.gather(*calls))


def pieces(text: str, limit: int) -> list[str]:
    """``text`` cut at sentence ends (or, for a sentence longer than ``limit``, at spaces, then anywhere) into
    pieces of at most ``limit`` characters, in order; one piece when it is short enough."""
    if len(text) <= limit:
        return [text]
    out: list[str] = []
    current = ""
    for sentence in (s for s in SENTENCE_END.split(text) if s):
        while len(sentence) > limit:  # one sentence too long: cut at the last space before the limit
            cut = sentence.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            if current:
                out.append(current)
                current = ""
            out.append(sentence[:cut])
            sentence = sentence[cut:].lstrip()
        if current and len(current) + 1 + len(sentence) > limit:
            out.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        out.append(current)
    return out
