"""One small Protocol per task. Backends implement exactly one method each (plus a ``info``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class BackendInfo:
    name: str
    task: str  # asr | mt | ocr | tts | vad | braille
    languages: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()
    # pairs served directly but never as a leg of a pivot (measured as routes of their own only)
    direct_only: tuple[tuple[str, str], ...] = ()
    licence: str = ""
    quality: str = ""
    low_confidence: bool = False


@dataclass
class ASRWord:
    """A word of a segment and its time (faster-whisper's ``word_timestamps``: cross-attention aligned to the
    audio by DTW), in seconds from the start of the audio transcribed; ``probability`` is its tokens' mean."""

    word: str
    start: float
    end: float
    probability: float


@dataclass
class ASRSegment:
    start: float
    end: float
    text: str
    confidence: float
    # its words, only when asked (``transcribe(word_timestamps=True)``: it costs an alignment pass per window)
    words: list[ASRWord] = field(default_factory=list)


@dataclass
class ASRResult:
    text: str
    language: str
    segments: list[ASRSegment] = field(default_factory=list)
    language_probability: float | None = None


@dataclass
class OCRLine:
    text: str
    confidence: float
    box: tuple[float, float, float, float]  # x0, y0, x1, y1


class ASR(Protocol):
    info: BackendInfo

    def transcribe(self, audio: np.ndarray, *, language: str | None, task: str = "transcribe",
                   initial_prompt: str | None = None, hotwords: str | None = None,
                   word_timestamps: bool = False) -> ASRResult:
        """Whisper's segments of ``audio``; with ``word_timestamps`` each carries its words (``ASRSegment.words``),
        or the backend raises ``NotConfigured`` when it cannot time words."""
        ...

    def transcribe_batch(self, audios: list[np.ndarray], *, language: str | None,
                         prompts: list[str | None] | None = None,
                         max_new_tokens: int = 160) -> list[tuple[str, float]]:
        """Short clips (one per stream) decoded together: (text, confidence) each."""
        ...

    def detect_language(self, audio: np.ndarray) -> tuple[str, float]:
        """The spoken language of (the first 30 s of) ``audio`` and its probability."""
        ...

    def detect_batch(self, audios: list[np.ndarray], candidates: Sequence[str]) -> list[dict[str, float]]:
        """Short clips (one per stream): each candidate language's probability for each, summing to 1 over the
        candidates (Whisper's language identification renormalised over them)."""
        ...


class MT(Protocol):
    info: BackendInfo

    def translate(self, texts: list[str], source: str, target: str) -> list[str]: ...


class OCR(Protocol):
    info: BackendInfo

    def recognize(self, image: np.ndarray, *, language: str | None = None) -> list[OCRLine]: ...


class TTS(Protocol):
    info: BackendInfo

    def synthesize(self, text: str, *, language: str) -> tuple[np.ndarray, int]: ...


class VAD(Protocol):
    info: BackendInfo

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Speech probability per 32 ms window of 16 kHz ``audio``."""
        ...


class Braille(Protocol):
    info: BackendInfo

    def translate(self, text: str, *, language: str) -> str: ...


def among(probs: Mapping[str, float], candidates: Sequence[str]) -> dict[str, float]:
    """``probs`` (a language identifier's, over every language it knows) over ``candidates`` only, renormalised to
    sum to 1; evenly spread when it gave none of them any weight (it cannot tell: the caller's threshold says so)."""
    picked = {c: max(0.0, float(probs.get(c, 0.0))) for c in candidates}
    total = sum(picked.values())
    if total <= 0.0:
        return {c: round(1.0 / len(picked), 4) for c in picked} if picked else {}
    return {c: round(p / total, 4) for c, p in picked.items()}
