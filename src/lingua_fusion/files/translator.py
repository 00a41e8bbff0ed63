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
from ..errors import EmptyInput, InvalidParameter, MediaTypeMismatch, NoContent, TooLarge, UnsupportedMedia
from ..glossary import Term, apply_mt, hotwords
from ..media import decode_audio, decode_image, sniff
from ..media.sniff import SUPPORTED_AV, SUPPORTED_IMAGES
from ..models.registry import MTRoute, Registry
from ..types import SOURCE_MODALITIES, TARGET_MODALITIES, Modality, Segment, TranslationResult

SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")


@dataclass
class FileRequest:
    source_modality: str
    target_lang: str
    target_modality: str = "text"
    source_lang: str | None = None
    data: bytes | None = None
    text: str | None = None
    glossary: list[Term] = field(default_factory=list)
    filename: str = ""


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


class _Stages:
    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def stage(self, name: str):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
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

    # ---- validation: every check, before any decoding ------------------------------------------------------
    def validate(self, req: FileRequest) -> ValidRequest:
        """Check a request without decoding its media: size, presence, languages and pair, modalities, then
        the bytes against the declared modality (container sniffing; a text file must be UTF-8, in limits).

        The order is the one the HTTP API answered in before validation moved here (tests/test_bad_input.py).
        """
        limits = self.settings.limits
        if req.data is not None and len(req.data) > limits.max_upload_bytes:
            raise TooLarge("file exceeds the upload limit", details={"limit": "max_upload_bytes"})
        if req.data is None and req.text is None:
            raise EmptyInput("send a 'file' or a 'text' field")
        if not req.target_lang:
            raise InvalidParameter("target_lang is required", details={"field": "target_lang"})
        source = langs.normalize(req.source_lang, field="source_lang") if req.source_lang else None
        target = langs.normalize(req.target_lang, field="target_lang")
        route = self.check_pair(source, target)  # fail fast, before decoding, on an unsupported pair
        src_mod, tgt_mod = self._modalities(req)
        if src_mod == Modality.TEXT:
            return ValidRequest(req, src_mod, tgt_mod, target, source, route, text=self._read_text(req))
        if not req.data:
            raise EmptyInput("no file was sent (or it is empty)")
        return ValidRequest(req, src_mod, tgt_mod, target, source, route,
                            container=self._check_kind(req.data, src_mod))

    @staticmethod
    def _modalities(req: FileRequest) -> tuple[Modality, Modality]:
        try:
            src_mod = Modality.parse(req.source_modality)
            tgt_mod = Modality.parse(req.target_modality)
        except ValueError as exc:
            details = {"source_modalities": sorted(m.value for m in SOURCE_MODALITIES),
                       "target_modalities": sorted(m.value for m in TARGET_MODALITIES)}
            raise InvalidParameter(f"unknown modality: {exc}", details=details) from exc
        if src_mod not in SOURCE_MODALITIES:
            raise InvalidParameter(f"{src_mod.value} is not an input modality")
        if tgt_mod not in TARGET_MODALITIES:
            raise InvalidParameter(f"{tgt_mod.value} is not an output modality (text, speech, braille)")
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
            if kind.family != "text":
                raise MediaTypeMismatch(f"declared text but the bytes look like {kind.container}",
                                        details={"detected": kind.container})
            try:
                text = req.data.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                raise MediaTypeMismatch(f"declared text but the file is not UTF-8 (byte {exc.start})",
                                        details={"detected": "binary"}) from exc
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
                raise MediaTypeMismatch(f"declared an image but the bytes look like {kind.container}",
                                        details={"detected": kind.container})
            if kind.container not in SUPPORTED_IMAGES:
                raise UnsupportedMedia(f"{kind.container} images are not supported (png, jpeg, webp)")
        else:
            if kind.family not in {"audio", "av"}:
                raise MediaTypeMismatch(f"declared {modality.value} but the bytes look like {kind.container}",
                                        details={"detected": kind.container})
            if kind.container not in SUPPORTED_AV:
                raise UnsupportedMedia(f"{kind.container} is not a supported container")
        return kind.container

    # ---- recognise -----------------------------------------------------------------------------------------
    def _asr(self, audio: np.ndarray, source: str | None, target: str, terms: list[Term],
             models: dict[str, str]) -> tuple[list[Segment], str, bool]:
        """Returns (segments with source text, detected language, already_in_target)."""
        route_ok = True
        speech_translate = False
        if source and source != target and target == "en":
            try:
                self.registry.mt_route(source, target)
            except Exception:
                route_ok = False
            speech_translate = not route_ok
        asr = self.registry.asr(source, task="translate" if speech_translate else "transcribe")
        models["asr"] = asr.info.name + (" (task=translate)" if speech_translate else "")
        res = asr.transcribe(audio, language=source, task="translate" if speech_translate else "transcribe",
                             hotwords=hotwords(terms) if terms else None)
        segs = [Segment(start=round(s.start, 3), end=round(s.end, 3), source_text=s.text, text=s.text,
                        confidence=s.confidence) for s in res.segments]
        lang = source or res.language
        if source is None and lang == target:
            speech_translate = False
        return segs, lang, speech_translate

    def _ocr(self, image: np.ndarray, source: str | None, models: dict[str, str]) -> list[Segment]:
        ocr = self.registry.ocr()
        models["ocr"] = ocr.info.name
        lines = ocr.recognize(image, language=source)
        return [Segment(start=0.0, end=0.0, source_text=ln.text, text=ln.text,
                        confidence=round(ln.confidence, 4)) for ln in lines if ln.text.strip()]

    # ---- translate -----------------------------------------------------------------------------------------
    def _translate(self, segs: list[Segment], route: MTRoute, terms: list[Term], models: dict[str, str]
                   ) -> list[Term]:
        legs = [(self.registry.mt(leg.backend), leg) for leg in route.legs]
        for i, (backend, _leg) in enumerate(legs):
            models["mt" if len(legs) == 1 else f"mt_leg{i + 1}"] = backend.info.name

        def run(texts: list[str]) -> list[str]:
            for backend, leg in legs:
                texts = backend.translate(texts, leg.source, leg.target)
            return texts

        # the glossary maps source -> target terms, so placeholders span the whole route (pivot included)
        texts, applied = apply_mt([s.source_text for s in segs], terms, run)
        for s, t in zip(segs, texts, strict=True):
            s.text = t
        return applied

    # ---- the whole request ---------------------------------------------------------------------------------
    def translate(self, req: FileRequest | ValidRequest) -> TranslationResult:
        """Translate a request: a FileRequest is validated first (``validate``), a ValidRequest not again."""
        st = _Stages()
        valid = req if isinstance(req, ValidRequest) else self.validate(req)
        data, glossary = valid.request.data, valid.request.glossary
        src_mod, tgt_mod = valid.source_modality, valid.target_modality
        target, source, route = valid.target_lang, valid.source_lang, valid.route
        models: dict[str, str] = {}
        warnings: list[str] = []
        duration: float | None = None
        if src_mod == Modality.TEXT:
            assert valid.text is not None
            segs = [Segment(start=0.0, end=0.0, source_text=p.strip(), text=p.strip())
                    for p in SENTENCE.split(valid.text) if p.strip()]
        else:
            assert data is not None
            if src_mod == Modality.IMAGE:
                with st.stage("decode"):
                    image = decode_image(data, self.settings.limits)
                with st.stage("ocr"):
                    segs = self._ocr(image, source, models)
            else:
                with st.stage("decode"):
                    audio, info = decode_audio(data, self.settings.limits, what=src_mod.value)
                duration = float(info["duration_s"])  # type: ignore[arg-type]
                if info["has_video"]:
                    warnings.append("video frames are not yet translated; the audio track was used")
                with st.stage("asr"):
                    segs, detected, already = self._asr(audio, source, target, glossary, models)
                if source is None:
                    source = detected
                if already:
                    for s in segs:
                        s.source_text = s.text
                    route = None
                    models["mt"] = "none (Whisper speech translation)"
        if not segs:
            raise NoContent("no speech or text was found in the input")
        if source is None:
            guessed = langs.guess_text_language(" ".join(s.source_text for s in segs))
            source = guessed or "en"
            warnings.append(f"source language {'guessed from the text' if guessed else 'assumed'}: {source}; "
                            "pass source_lang to be sure")
        applied: list[Term] = []
        low = False
        if source != target and "mt" not in models:
            route = self.registry.mt_route(source, target)
            with st.stage("mt"):
                applied = self._translate(segs, route, glossary, models)
            low = route.low_confidence
            if low:
                warnings.append("low-confidence translation: the only model for this pair is a tiny LLM")
        result = TranslationResult(
            text=" ".join(s.text for s in segs).strip(),
            source_text=" ".join(s.source_text for s in segs).strip(),
            source_lang=source, target_lang=target, source_modality=src_mod.value,
            target_modality=tgt_mod.value, segments=segs, models=models, pivot=route.pivot if route else None,
            low_confidence=low, warnings=warnings, duration_s=duration,
            glossary_terms_applied=[{"source": t.source, "target": t.target} for t in applied])
        if tgt_mod == Modality.SPEECH:
            with st.stage("tts"):
                tts = self.registry.tts(target)
                result.models["tts"] = tts.info.name
                from ..models.tts import to_wav

                pcm, sr = tts.synthesize(result.text, language=target)
                result.audio = to_wav(pcm, sr)
                result.audio_format = "wav"
        elif tgt_mod == Modality.BRAILLE:
            with st.stage("braille"):
                br = self.registry.braille()
                result.models["braille"] = br.info.name
                result.braille = br.translate(result.text, language=target)
        result.latency_ms = st.total()
        if self.observer is not None:
            for k, v in result.latency_ms.items():
                self.observer.stage(k, v / 1000)
        return result

    def close(self) -> None:
        self.registry.close()
