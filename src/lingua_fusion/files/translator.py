"""File translation: validate -> decode -> recognise -> translate -> emit, one request per call (thread-safe).

The translator knows nothing of HTTP. ``FileTranslator.validate`` is the one place a request is checked
(size, presence, languages, pair, modalities, the bytes against the declared modality); the API and the
in-process SDK both go through it. It raises errors from ``lingua_fusion.errors``; the API maps them to codes.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import langs
from ..config import Settings
from ..deadline import Deadline
from ..errors import (
    EmptyInput,
    InvalidParameter,
    MediaTypeMismatch,
    NoContent,
    TooLarge,
    UnknownLanguage,
    UnsupportedMedia,
    UnsupportedPair,
)
from ..glossary import Term, apply_mt, hotwords
from ..media import decode_audio, decode_image, sniff
from ..media.sniff import SUPPORTED_AV, SUPPORTED_IMAGES
from ..models.registry import MTRoute, Registry
from ..tracing import TraceRef, span
from ..types import SOURCE_MODALITIES, TARGET_MODALITIES, Modality, Segment, TranslationResult

MT_CHUNK = 32  # segments per MT call (a request's deadline is checked between calls)
SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")


@dataclass
class FileRequest:
    source_modality: str | None  # None or "": told by the bytes (text when ``text`` is given)
    target_lang: str
    target_modality: str = "text"
    source_lang: str | None = None
    data: bytes | None = None
    text: str | None = None
    glossary: list[Term] = field(default_factory=list)
    filename: str = ""
    prompt: str | None = None  # ASR context (Whisper's initial prompt): names, spellings, the style wanted
    transcribe_only: bool = False  # speech -> text in the spoken language: no MT; target_lang is not used
    signs: Any = None  # vision/file_signs.py SignReader: a video's signs read with the key's vocabulary_id


@dataclass(frozen=True)
class ValidRequest:
    """A FileRequest that passed ``FileTranslator.validate``: parsed modalities, normalised languages, the MT
    route (None while the source language is unknown or equals the target), a text request's decoded text."""

    request: FileRequest
    source_modality: Modality
    target_modality: Modality
    target_lang: str
    source_lang: str | None
    route: MTRoute | None
    text: str | None = None  # text requests only
    container: str | None = None  # media requests only: what the bytes are (wav, mp4, png, ...)
    speech_translation: bool = False  # no MT pair: Whisper translates the speech into English (then MT from en)
    source_confidence: float | None = None  # set when the text's language was identified here


SPEECH_CONFIDENT = 0.5  # a spoken-language detection below this is reported as LOW
_MODALITY_WORDS = {m.value for m in Modality} | {"slide", "slides"}
_FAMILY_MODALITY = {"audio": "audio", "av": "video", "image": "image", "text": "text"}


def _detected_modality(req: FileRequest) -> str:
    """No source_modality given: a text field is text; a file is what its bytes are (never its name)."""
    if req.text is not None or not req.data:
        return "text" if req.text is not None else "audio"
    kind = sniff(req.data)
    if kind.family not in _FAMILY_MODALITY:
        raise UnsupportedMedia("cannot tell what this file is: it is not audio, video, an image (png, jpeg, webp) "
                               "or UTF-8 text", details={"detected": kind.container, "field": "source_modality"})
    return _FAMILY_MODALITY[kind.family]


def _is_speech(req: FileRequest) -> bool:
    """Whether the request carries speech (declared, or told by its bytes), without raising."""
    declared = (req.source_modality or "").strip().lower()
    if declared:
        return declared in {"audio", "video", "speech"}
    return req.text is None and bool(req.data) and sniff(req.data).family in {"audio", "av"}


def _looks_like(container: str) -> str:
    if container == "unknown":
        return "is not a format this server reads (audio, video, png / jpeg / webp image, UTF-8 text)"
    if container == "text":
        return "is text"
    return f"is {'an' if container[0] in 'aeiou' else 'a'} {container.upper()} file"


@dataclass
class _Work:
    """What one request learns on its way: the source language (given or detected), the route, warnings."""

    source: str | None
    target: str
    route: MTRoute | None
    speech_translation: bool = False
    confidence: float | None = None
    detected: bool = False
    transcribe_only: bool = False  # the target is the spoken language, whatever it turns out to be
    duration: float | None = None
    models: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    video: Any = None  # video/file_video.py VideoRead: the slides read from a video's frames (ASR and MT context)
    deadline: Deadline | None = None  # the request's: optional work (slide corrections) stops early near it
    signs: list[Any] = field(default_factory=list)  # vision/service.py GlossSpan: signs read (vocabulary_id)


class _Stages:
    """Per-stage latency, and the request's deadline checked as each stage starts."""

    def __init__(self, deadline: Deadline | None = None, trace: TraceRef | None = None) -> None:
        self.ms: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self.deadline = deadline
        self.trace = trace  # the request's span (tracing on): each stage is a child span

    @contextmanager
    def stage(self, name: str):  # type: ignore[no-untyped-def]
        if self.deadline is not None:
            self.deadline.check(name)  # RequestTimeout (504): the thread stops here instead of finishing late
        t = time.perf_counter()
        try:
            with span(self.trace, name):
                yield
        finally:
            self.ms[name] = round(self.ms.get(name, 0.0) + (time.perf_counter() - t) * 1000, 2)

    def total(self) -> dict[str, float]:
        return {**self.ms, "total": round((time.perf_counter() - self._t0) * 1000, 2)}


class FileTranslator:
    def __init__(self, settings: Settings | None = None, registry: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = registry or Registry(self.settings)
        self.observer: Any = None  # set by the API: observer.stage(name, seconds)
        self.slide_context = True  # a video's slide words feed ASR (hot words) and MT (names kept as written)

    # ---- validation: every check, before any decoding ------------------------------------------------------
    def validate(self, req: FileRequest) -> ValidRequest:
        """Check a request without decoding its media: size, presence, languages and pair, modalities, then
        the bytes against the declared modality (container sniffing; a text file must be UTF-8, in limits).
        A text's language, when not given, is identified here: an unsure guess is refused before any work.

        The order is the one the HTTP API answered in before validation moved here (tests/test_bad_input.py).
        """
        limits = self.settings.limits
        if req.data is not None and len(req.data) > limits.max_upload_bytes:
            raise TooLarge("file exceeds the upload limit", details={"limit": "max_upload_bytes"})
        if req.data is None and req.text is None:
            raise EmptyInput("send a 'file' or a 'text' field")
        if req.data is not None and req.text is not None:
            raise InvalidParameter("send a 'file' or a 'text' field, not both", details={"field": "text"})
        if not req.target_lang and not req.transcribe_only:
            raise InvalidParameter("target_lang is required", details={"field": "target_lang"})
        source = langs.normalize(req.source_lang, field="source_lang") if req.source_lang else None
        # a transcription's target is the spoken language: given, or "" until Whisper has detected it
        target = (source or "") if req.transcribe_only else langs.normalize(req.target_lang, field="target_lang")
        speech = _is_speech(req)
        route, speech_translation = self._plan(source, target, speech)  # fail fast on an unsupported pair
        src_mod, tgt_mod = self._modalities(req)
        if req.transcribe_only and src_mod not in (Modality.AUDIO, Modality.VIDEO):
            raise InvalidParameter("a transcription takes speech: an audio or video file",
                                   details={"field": "source_modality"})
        if src_mod == Modality.TEXT:
            text = self._read_text(req)
            confidence = None
            if source is None:
                source, confidence = self._identify(text)
                route, _ = self._plan(source, target, False)
            return ValidRequest(req, src_mod, tgt_mod, target, source, route, text=text,
                                source_confidence=confidence)
        if not req.data:
            raise EmptyInput("no file was sent (or it is empty)")
        return ValidRequest(req, src_mod, tgt_mod, target, source, route,
                            container=self._check_kind(req.data, src_mod), speech_translation=speech_translation)

    def _plan(self, source: str | None, target: str, speech: bool) -> tuple[MTRoute | None, bool]:
        """(route, speech_translation): the MT route for the pair; for speech with no pair, Whisper's speech ->
        English task and then the en -> target route (None when the target is English)."""
        try:
            return self.check_pair(source, target), False
        except UnsupportedPair:
            if not speech or source is None:
                raise
            return self.registry.speech_translation_route(source, target), True

    @staticmethod
    def _identify(text: str) -> tuple[str, float]:
        guess = langs.identify(text)
        if not guess.sure:
            hint = (f" (best guess {langs.name(guess.lang)}, confidence {guess.confidence:.2f})"
                    if guess.lang and guess.confidence >= 0.3 else "")
            raise UnknownLanguage(f"cannot tell which language this text is in{hint}: pass source_lang",
                                  details={"field": "source_lang", "guess": guess.lang,
                                           "confidence": guess.confidence})
        assert guess.lang is not None
        return guess.lang, guess.confidence

    @staticmethod
    def _modalities(req: FileRequest) -> tuple[Modality, Modality]:
        declared = req.source_modality or _detected_modality(req)
        try:
            src_mod = Modality.parse(declared)
            tgt_mod = Modality.parse(req.target_modality)
        except ValueError:
            details = {"source_modalities": ["audio", "video", "image", "text"],
                       "target_modalities": ["text", "speech", "braille"]}
            source_bad = declared.strip().lower() not in _MODALITY_WORDS
            which, bad = ("source", declared) if source_bad else ("target", req.target_modality)
            raise InvalidParameter(f"{which}_modality {bad!r} is not one of "
                                   f"{', '.join(details[which + '_modalities'])}",
                                   details={**details, "field": f"{which}_modality"}) from None
        if src_mod not in SOURCE_MODALITIES:
            raise InvalidParameter(f"{src_mod.value} is not an input modality (audio, video, image, text)",
                                   details={"field": "source_modality"})
        if tgt_mod not in TARGET_MODALITIES:
            raise InvalidParameter(f"{tgt_mod.value} is not an output modality (text, speech, braille)",
                                   details={"field": "target_modality"})
        return (Modality.AUDIO if src_mod == Modality.SPEECH else src_mod), tgt_mod

    def check_pair(self, source: str | None, target: str) -> MTRoute | None:
        if source is None or source == target:
            return None
        return self.registry.mt_route(source, target)

    def _read_text(self, req: FileRequest) -> str:
        if req.text is not None:
            text = req.text
        else:
            assert req.data is not None
            kind = sniff(req.data)  # reads the first 4 KiB only: a bad byte after them is caught below
            if kind.family != "text" and kind.container != "unknown":
                raise MediaTypeMismatch(f"declared text but the file {_looks_like(kind.container)}",
                                        details={"detected": kind.container, "field": "source_modality"})
            try:
                text = req.data.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                raise MediaTypeMismatch(f"declared text but the file is not UTF-8 text (byte {exc.start} is "
                                        f"0x{req.data[exc.start]:02x}); save it as UTF-8",
                                        details={"detected": "binary", "field": "source_modality"}) from exc
            if "\x00" in text[:4096]:
                raise MediaTypeMismatch("declared text but the file is binary (it holds NUL bytes)",
                                        details={"detected": "binary", "field": "source_modality"})
        limit = self.settings.limits.max_text_chars
        if len(text) > limit:
            raise TooLarge(f"text has {len(text)} characters; the limit is {limit}",
                           details={"limit": "max_text_chars"})
        if not text.strip():
            raise EmptyInput("text is empty")
        return text

    def _check_kind(self, data: bytes, modality: Modality) -> str:
        kind = sniff(data)
        if modality == Modality.IMAGE:
            if kind.family != "image":
                raise MediaTypeMismatch(f"declared an image but the file {_looks_like(kind.container)}",
                                        details={"detected": kind.container, "field": "source_modality"})
            if kind.container not in SUPPORTED_IMAGES:
                raise UnsupportedMedia(f"{kind.container} images are not supported (png, jpeg, webp)")
        else:
            if kind.family not in {"audio", "av"}:
                raise MediaTypeMismatch(f"declared {modality.value} but the file {_looks_like(kind.container)}",
                                        details={"detected": kind.container, "field": "source_modality"})
            if kind.container not in SUPPORTED_AV:
                raise UnsupportedMedia(f"{kind.container} is not a supported container")
        return kind.container

    # ---- recognise -----------------------------------------------------------------------------------------
    def _asr(self, audio: np.ndarray, work: _Work, glossary: list[Term], prompt: str | None) -> list[Segment]:
        """Speech -> segments. Without a source language Whisper detects it (its probability is reported); with
        no MT pair from that language, Whisper's task=translate gives English (``work.speech_translation``)."""
        hot = hotwords(glossary) if glossary else None
        task = "translate" if work.speech_translation else "transcribe"
        asr = self.registry.asr(work.source, task=task)
        res = self._transcribe(asr, audio, work, task, hot, prompt)
        if work.source is None:
            work.source = langs.normalize(res.language, field="source_lang")
            work.detected, work.confidence = True, round(float(res.language_probability or 0.0), 3)
            if work.transcribe_only:
                work.target = work.source
            if work.source != work.target:
                try:
                    work.route = self.registry.mt_route(work.source, work.target)
                except UnsupportedPair:  # Whisper can still translate the speech into English
                    work.route = self.registry.speech_translation_route(work.source, work.target)
                    work.speech_translation, task = True, "translate"
                    asr = self.registry.asr(work.source, task=task)
                    res = self._transcribe(asr, audio, work, task, hot, prompt)
        work.models["asr"] = asr.info.name + (" (task=translate)" if work.speech_translation else "")
        return [Segment(start=round(s.start, 3), end=round(s.end, 3), source_text=s.text, text=s.text,
                        confidence=s.confidence) for s in res.segments]

    def _transcribe(self, asr: Any, audio: np.ndarray, work: _Work, task: str, hot: str | None,
                    prompt: str | None) -> Any:
        """One Whisper call; for a video whose slides were read, slide terms are then corrected from each slide's
        audio transcribed again with the slide's words as the prompt (video/context.py). Slides in another language
        than the speech are not used (they would pull Whisper into their language)."""
        def run(x: np.ndarray, slide_prompt: str | None = None, language: str | None = work.source) -> Any:
            both = " ".join(p for p in (prompt, slide_prompt) if p) or None
            return asr.transcribe(x, language=language, task=task, hotwords=hot, initial_prompt=both)

        res = run(audio)
        if work.video is None or not work.video.slides or not self.slide_context or task != "transcribe":
            return res
        from ..video.context import correct_with_slides, pieces

        shown = langs.identify(" ".join(s.source_text for s in work.video.slides))
        if not res.segments or (shown.sure and shown.lang != res.language):
            return res
        deadline = work.deadline
        return correct_with_slides(res, lambda x, p: run(x, p, res.language), audio,
                                   pieces(work.video.slides, audio),
                                   stop=(lambda: deadline.left() < deadline.seconds / 3) if deadline else None)

    def _ocr(self, image: np.ndarray, source: str | None, models: dict[str, str]) -> list[Segment]:
        ocr = self.registry.ocr()
        models["ocr"] = ocr.info.name
        lines = ocr.recognize(image, language=source)
        return [Segment(start=0.0, end=0.0, source_text=ln.text, text=ln.text,
                        confidence=round(ln.confidence, 4)) for ln in lines if ln.text.strip()]

    def _recognise(self, valid: ValidRequest, work: _Work, st: _Stages) -> list[Segment]:
        data = valid.request.data
        if valid.request.signs is not None and valid.source_modality != Modality.VIDEO:
            work.warnings.append("vocabulary_id: signs are read from a video's frames; this input has none")
        if valid.source_modality == Modality.TEXT:
            assert valid.text is not None
            return [Segment(start=0.0, end=0.0, source_text=p.strip(), text=p.strip())
                    for p in SENTENCE.split(valid.text) if p.strip()]
        assert data is not None
        if valid.source_modality == Modality.IMAGE:
            with st.stage("decode"):
                image = decode_image(data, self.settings.limits)
            with st.stage("ocr"):
                segs = self._ocr(image, work.source, work.models)
            if segs and work.source is None:
                work.source, work.confidence = self._identify(" ".join(s.source_text for s in segs))
                work.detected = True
            return segs
        if valid.source_modality == Modality.VIDEO and not self._read_frames(data, work, st, valid.request.signs):
            return []  # a video without an audio track: its slides are what it says
        with st.stage("decode"):
            audio, info = decode_audio(data, self.settings.limits, what=valid.source_modality.value)
        work.duration = float(info["duration_s"])  # type: ignore[arg-type]
        if info["has_video"] and work.video is None:
            work.warnings.append("video frames were not read (source_modality audio): only the audio track was used")
        with st.stage("asr"):
            return self._asr(audio, work, valid.request.glossary, valid.request.prompt)

    def _read_frames(self, data: bytes, work: _Work, st: _Stages, signs: Any = None) -> bool:
        """A video's frames -> its slides (``work.video``; their words become ASR prompts and MT names). Returns
        whether the file has an audio track to transcribe."""
        from ..video.fanout import FrameContext
        from ..video.file_video import read_video
        from ..video.slide_reader import MAX_READS

        with st.stage("video"):
            video = read_video(data, self.settings, self.registry,
                               FrameContext(work.source, work.target, self.settings, self.registry, signs),
                               deadline=st.deadline)
            work.signs = signs.finish() if signs is not None else []
        if not video.probe.has_video:
            return True
        work.video, work.deadline = video, st.deadline
        if video.slides:
            work.models["ocr"] = video.ocr_model
        else:
            work.warnings.append("no slide or whiteboard text was found in the video frames")
        if video.capped:
            work.warnings.append(f"the slide changed more than {MAX_READS} times: later slides were not read")
        if video.probe.has_audio:
            return True
        work.duration = video.probe.duration_s
        if video.slides and work.source is None:
            work.source, work.confidence = self._identify(" ".join(s.source_text for s in video.slides))
            work.detected = True
        return False

    def _slides(self, work: _Work, glossary: list[Term], tgt_mod: Modality, st: _Stages) -> list[Any]:
        """The video's slides, each row translated (the same route and glossary as the speech), as results."""
        from ..video.file_video import slide_texts

        assert work.source is not None
        route = work.route
        if work.speech_translation:  # Whisper translated the speech; the slides need a text pair of their own
            try:
                route = self.check_pair(work.source, work.target)
            except UnsupportedPair:
                route = None
                work.warnings.append(f"slides were not translated: no model translates {work.source} -> "
                                     f"{work.target} text")

        def mt(rows: list[str]) -> list[str]:
            assert route is not None
            segs = [Segment(start=0.0, end=0.0, source_text=r, text=r) for r in rows]
            self._translate(segs, route, glossary, work.models, st.deadline)
            return [s.text for s in segs]

        braille = None
        if tgt_mod == Modality.BRAILLE:
            br = self.registry.braille()
            braille = lambda text: br.translate(text, language=work.target)  # noqa: E731
        with st.stage("slides_mt"):
            return slide_texts(work.video.slides, mt if route is not None else None, braille)

    def _signs(self, reader: Any, work: _Work, st: _Stages) -> list[Any]:
        """The video's known signs, each gloss translated from the vocabulary's language (vision/file_signs.py)."""
        from ..vision.file_signs import sign_texts

        route = None
        if reader.lang != work.target:
            try:
                route = self.check_pair(reader.lang, work.target)
            except UnsupportedPair:
                work.warnings.append(f"signs were not translated: no model translates {reader.lang} -> {work.target}")

        def mt(texts: list[str]) -> list[str]:
            assert route is not None
            segs = [Segment(start=0.0, end=0.0, source_text=t, text=t) for t in texts]
            self._translate(segs, route, [], work.models, st.deadline)
            return [s.text for s in segs]

        with st.stage("signs_mt"):
            return sign_texts(work.signs, mt if route is not None else None)

    def _slide_names(self, work: _Work, segs: list[Segment], glossary: list[Term]) -> list[Term]:
        """Names on the slides (acronyms, product names) that the speech says and that MT would mangle: each is
        translated alone once; one that comes back changed but spelt alike ("Acme" -> "Acmé") is kept as written,
        one that comes back unchanged needs nothing, and one translated for real ("Monday" -> "lunes") is left to MT
        (a protected term also changes the words around it: Apertium put "encima" for "on" before one)."""
        from difflib import SequenceMatcher

        if work.video is None or not self.slide_context or work.route is None:
            return []
        own = {t.source.lower() for t in glossary}
        said = " ".join(s.source_text for s in segs)
        names = [n for n in work.video.names()
                 if n.lower() not in own and re.search(rf"\b{re.escape(n)}\b", said)]
        if not names:
            return []
        probe = [Segment(start=0.0, end=0.0, source_text=n, text=n) for n in names]
        self._translate(probe, work.route, [], {}, None)
        return [Term(n, n) for n, p in zip(names, probe, strict=True)
                if p.text.strip() != n and SequenceMatcher(None, n.lower(), p.text.strip().lower()).ratio() >= 0.6]

    # ---- translate -----------------------------------------------------------------------------------------
    def _translate(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str],
                   deadline: Deadline | None = None) -> list[Term]:
        legs = [(self.registry.mt(leg.backend), leg) for leg in route.legs]
        for i, (backend, _leg) in enumerate(legs):
            models["mt" if len(legs) == 1 else f"mt_leg{i + 1}"] = backend.info.name

        def run(texts: list[str]) -> list[str]:
            out: list[str] = []
            for i in range(0, len(texts), MT_CHUNK):  # in chunks, the deadline checked between them
                if deadline is not None:
                    deadline.check("mt")
                chunk = texts[i:i + MT_CHUNK]
                for backend, leg in legs:
                    chunk = backend.translate(chunk, leg.source, leg.target)
                out += chunk
            return out

        # the glossary maps source -> target terms, so placeholders span the whole route (pivot included)
        sources = [s.source_text for s in segs]
        tm = self.registry.translation_memory()  # the same slide for many users: MT once (lingua_fusion/tm)
        if tm is None:
            texts, applied = apply_mt(sources, terms, run, deadline=deadline)
        else:
            texts, per_text = tm.translate(self.registry.route_key(route), sources, [terms] * len(sources), run,
                                           deadline=deadline)
            applied = list({t.source: t for used in per_text for t in used}.values())
        for s, t in zip(segs, texts, strict=True):
            s.text = t
        return applied

    def _say_what_happened(self, work: _Work) -> None:
        """Warnings for everything a user could take for a translation when it is not quite one."""
        assert work.source is not None
        name = f"{langs.name(work.source)} ({work.source})"
        if work.detected:
            sure = work.confidence is not None and work.confidence >= SPEECH_CONFIDENT
            work.warnings.insert(0, f"detected source language: {work.source} ({langs.name(work.source)}), "
                                 f"confidence {work.confidence:.2f}"
                                 + ("" if sure else " (LOW: the detection may be wrong)")
                                 + "; pass source_lang to set it")
        if work.source == work.target and not work.transcribe_only:
            work.warnings.append(f"nothing was translated: the input is already in {name}"
                                 + (" (detected)" if work.detected else " (source_lang equals target_lang)")
                                 + ("; pass source_lang if it is another language" if work.detected else ""))
        if work.speech_translation:
            work.warnings.append(f"no model translates {work.source} -> {work.target} text: Whisper translated "
                                 "the speech into English" + ("" if work.target == "en" else
                                                              f", then {work.route.describe() if work.route else ''}"))
        route = work.route
        if route is not None and route.low_confidence:
            times = "twice" if route.llm_legs > 1 else "once"
            work.warnings.append(f"low-confidence translation: this pair goes through the tiny LLM {times} "
                                 f"({route.describe()}); it is slow and often changes facts out of English")

    # ---- the whole request ---------------------------------------------------------------------------------
    def translate(self, req: FileRequest | ValidRequest, *, deadline: Deadline | None = None,
                  trace: TraceRef | None = None) -> TranslationResult:
        """Translate a request: a FileRequest is validated first (``validate``), a ValidRequest not again.
        ``deadline``: checked as each stage starts and between MT chunks (RequestTimeout past it). ``trace``: the
        request's span (tracing on), parent of one span per stage."""
        st = _Stages(deadline, trace)
        valid = req if isinstance(req, ValidRequest) else self.validate(req)
        glossary, tgt_mod = valid.request.glossary, valid.target_modality
        work = _Work(source=valid.source_lang, target=valid.target_lang, route=valid.route,
                     speech_translation=valid.speech_translation, confidence=valid.source_confidence,
                     detected=valid.source_confidence is not None, transcribe_only=valid.request.transcribe_only)
        segs = self._recognise(valid, work, st)
        if not segs and not (work.video is not None and work.video.slides) and not any(
                s.recognition.known for s in work.signs):
            raise NoContent("no speech or text was found in the input")
        if work.source is None and valid.request.signs is not None:  # only signs: their vocabulary's language
            work.source = valid.request.signs.lang
        assert work.source is not None
        if work.speech_translation:
            work.models["mt"] = "none (Whisper speech translation)" if work.route is None else ""
            for s in segs:
                s.source_text = s.text  # Whisper's English is the only transcript there is
        elif work.source == work.target:
            work.route = None
        elif work.route is None:
            work.route = self.registry.mt_route(work.source, work.target)
        applied: list[Term] = []
        if work.route is not None and segs:
            names = self._slide_names(work, segs, glossary)
            with st.stage("mt"):
                applied = self._translate(segs, work.route, glossary + names, work.models, st.deadline)
            applied = [t for t in applied if t not in names]
        slides = self._slides(work, glossary, tgt_mod, st) if work.video is not None and work.video.slides else []
        signs = self._signs(valid.request.signs, work, st) if work.signs else []
        work.models = {k: v for k, v in work.models.items() if v}
        self._say_what_happened(work)
        route = work.route
        described = route.describe() if route else None
        if work.speech_translation:
            described = "whisper speech->en" + (f", {described}" if described else "")
        shown = segs or slides or signs  # a video without speech: its slides (or signs) are its text
        result = TranslationResult(
            text=("\n\n" if not segs else " ").join(s.text for s in shown).strip(),
            source_text=("\n\n" if not segs else " ").join(s.source_text for s in shown).strip(), slides=slides,
            signs=signs,
            source_lang=work.source, target_lang=work.target, source_modality=valid.source_modality.value,
            target_modality=tgt_mod.value, segments=segs, models=work.models,
            pivot="en" if work.speech_translation and route else (route.pivot if route else None),
            route=described, quality=(route.tier if route else ("standard" if work.speech_translation else None)),
            low_confidence=bool(route and route.low_confidence), warnings=work.warnings, duration_s=work.duration,
            source_lang_detected=work.detected, source_lang_confidence=work.confidence,
            glossary_terms_applied=[{"source": t.source, "target": t.target} for t in applied])
        self._emit(result, tgt_mod, st)
        result.latency_ms = st.total()
        if trace is not None:
            trace.set(source_lang=result.source_lang, target_lang=result.target_lang, route=result.route)
        if self.observer is not None:
            for k, v in result.latency_ms.items():
                self.observer.stage(k, v / 1000)
        return result

    def _emit(self, result: TranslationResult, tgt_mod: Modality, st: _Stages) -> None:
        if tgt_mod == Modality.SPEECH:
            with st.stage("tts"):
                tts = self.registry.tts(result.target_lang)
                result.models["tts"] = tts.info.name
                from ..models.tts import to_wav

                pcm, sr = tts.synthesize(result.text, language=result.target_lang)
                result.audio = to_wav(pcm, sr)
                result.audio_format = "wav"
        elif tgt_mod == Modality.BRAILLE:
            with st.stage("braille"):
                br = self.registry.braille()
                result.models["braille"] = br.info.name
                result.braille = br.translate(result.text, language=result.target_lang)

    def close(self) -> None:
        self.registry.close()
