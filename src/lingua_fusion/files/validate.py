"""Request validation: every check of a FileRequest, before any decoding, in one place.

``RequestValidator.validate`` checks size, presence, languages and pair, modalities, then the bytes against the
declared modality; the API and the in-process SDK both go through it (via ``FileTranslator.validate``). It raises
errors from ``lingua_fusion.errors``; the API maps them to codes. ``identify`` (a text's language, or
``UnknownLanguage``) and ``check_pair`` (a pair's MT route) serve the later stages too.
"""

from __future__ import annotations

from .. import langs
from ..config import Settings
from ..errors import (
    CorruptMedia,
    EmptyInput,
    InvalidParameter,
    MediaTypeMismatch,
    NotConfigured,
    TooLarge,
    UnknownLanguage,
    UnsupportedMedia,
    UnsupportedPair,
)
from ..media import sniff
from ..media.sniff import SUPPORTED_AV, SUPPORTED_IMAGES, MediaKind, cut_in_signature
from ..models.registry import Registry
from ..models.routes import MTRoute
from ..models.word_times import WORDS_NEED_CT2
from ..types import SOURCE_MODALITIES, TARGET_MODALITIES, Modality
from .request import FileRequest, ValidRequest

_MODALITY_WORDS = {m.value for m in Modality} | {"slide", "slides"}
_FAMILY_MODALITY = {"audio": "audio", "av": "video", "image": "image", "text": "text"}


def _sniff_whole(data: bytes) -> MediaKind:
    """``sniff``, after refusing a file cut inside its container's signature (damaged, not of an unknown kind)."""
    if (cut := cut_in_signature(data)) is not None:
        raise CorruptMedia(cut, details={"bytes": len(data)})
    return sniff(data)


def _detected_modality(req: FileRequest) -> str:
    """No source_modality given: a text field is text; a file is what its bytes are (never its name)."""
    if req.text is not None or not req.data:
        return "text" if req.text is not None else "audio"
    kind = _sniff_whole(req.data)
    if kind.family not in _FAMILY_MODALITY:
        raise UnsupportedMedia("cannot tell what this file is: it is not audio, video, an image (png, jpeg, webp) "
                               "or UTF-8 text", details={"detected": kind.container, "field": "source_modality"})
    if kind.family == "av" and not has_video_stream(req.data):
        return "audio"  # an .ogg, .webm or .m4a that holds only sound
    return _FAMILY_MODALITY[kind.family]


def has_video_stream(data: bytes) -> bool:
    """Whether a container (ogg, mp4, webm, mkv) holds a video stream: its header only, no frame is decoded. A file
    PyAV cannot open is taken as video, for the video path to refuse with its own error."""
    import io

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            return any(s.type == "video" and s.codec_context.name not in {"mjpeg", "png"}  # cover art is no video
                       for s in container.streams)
    except (av.error.FFmpegError, ValueError, OSError):
        return True


def _is_speech(req: FileRequest) -> bool:
    """Whether the request carries speech (declared, or told by its bytes), without raising."""
    declared = (req.source_modality or "").strip().lower()
    if declared:
        return declared in {"audio", "video", "speech"}
    return req.text is None and req.data is not None and bool(req.data) and sniff(req.data).family in {"audio", "av"}


def _looks_like(container: str) -> str:
    if container == "unknown":
        return "is not a format this server reads (audio, video, png / jpeg / webp image, UTF-8 text)"
    if container == "text":
        return "is text"
    return f"is {'an' if container[0] in 'aeiou' else 'a'} {container.upper()} file"


def check_pair(registry: Registry, source: str | None, target: str) -> MTRoute | None:
    """The MT route for a pair: None when there is nothing to translate; ``UnsupportedPair`` when none exists."""
    if source is None or source == target:
        return None
    return registry.mt_route(source, target)


def identify(text: str) -> tuple[str, float]:
    """(language, confidence) of a text; an unsure guess raises ``UnknownLanguage`` (pass source_lang)."""
    guess = langs.identify(text)
    if not guess.sure:
        hint = (f" (best guess {langs.name(guess.lang)}, confidence {guess.confidence:.2f})"
                if guess.lang and guess.confidence >= 0.3 else "")
        raise UnknownLanguage(f"cannot tell which language this text is in{hint}: pass source_lang",
                              details={"field": "source_lang", "guess": guess.lang,
                                       "confidence": guess.confidence})
    assert guess.lang is not None
    return guess.lang, guess.confidence


class RequestValidator:
    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry

    def validate(self, req: FileRequest) -> ValidRequest:
        """Check a request without decoding its media: size, presence, languages and pair, modalities, then
        the bytes against the declared modality (container sniffing; a text file must be UTF-8, in limits).
        A text's language, when not given, is identified here: an unsure guess is refused before any work.

        The order is the one the HTTP API answered in before validation moved here (tests/e2e/test_bad_input.py).
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
        self._check_diarize(req, src_mod)
        if req.word_timestamps:
            self._check_words(src_mod)
        if src_mod == Modality.TEXT:
            text = self._read_text(req)
            confidence = None
            if source is None:
                source, confidence = identify(text)
                route, _ = self._plan(source, target, False)
            return ValidRequest(req, src_mod, tgt_mod, target, source, route, text=text,
                                source_confidence=confidence)
        if not req.data:
            raise EmptyInput("no file was sent (or it is empty)")
        return ValidRequest(req, src_mod, tgt_mod, target, source, route,
                            container=self._check_kind(req.data, src_mod), speech_translation=speech_translation)

    def _check_diarize(self, req: FileRequest, src_mod: Modality) -> None:
        """diarize takes speech; max_speakers is 1 .. diarize.max_speakers and needs diarize."""
        cap = self.settings.diarize.max_speakers
        if req.max_speakers is not None:
            if not req.diarize:
                raise InvalidParameter("max_speakers needs diarize=true", details={"field": "max_speakers"})
            if not 1 <= req.max_speakers <= cap:
                raise InvalidParameter(f"max_speakers must be from 1 to {cap}",
                                       details={"field": "max_speakers", "max": cap})
        if req.diarize and src_mod not in (Modality.AUDIO, Modality.VIDEO):
            raise InvalidParameter("diarize tells speakers apart in speech: send an audio or video file",
                                   details={"field": "diarize"})

    def _check_words(self, src_mod: Modality) -> None:
        """Word times are of speech, timed by the CTranslate2 backend (the torch port has no alignment pass)."""
        if src_mod not in (Modality.AUDIO, Modality.VIDEO):
            raise InvalidParameter(f"word_timestamps times spoken words: a {src_mod.value} input has none (send "
                                   "an audio or video file)", details={"field": "word_timestamps"})
        if self.settings.models.backend == "torch":
            raise NotConfigured(WORDS_NEED_CT2, details={"field": "word_timestamps"})

    def _plan(self, source: str | None, target: str, speech: bool) -> tuple[MTRoute | None, bool]:
        """(route, speech_translation): the MT route for the pair; for speech with no pair, Whisper's speech ->
        English task and then the en -> target route (None when the target is English)."""
        try:
            return check_pair(self.registry, source, target), False
        except UnsupportedPair:
            if not speech or source is None:
                raise
            return self.registry.speech_translation_route(source, target), True

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
        kind = _sniff_whole(data)
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
