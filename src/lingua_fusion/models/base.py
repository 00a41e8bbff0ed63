"""One small Protocol per task. Backends implement exactly one method each (plus a ``info``)."""

from __future__ import annotations

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
class ASRSegment:
    start: float
    end: float
    text: str
    confidence: float


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
                   initial_prompt: str | None = None, hotwords: str | None = None) -> ASRResult: ...


class MT(Protocol):
    info: BackendInfo

    def translate(self, texts: list[str], source: str, target: str) -> list[str]: ...


class OCR(Protocol):
    info: BackendInfo

    def recognize(self, image: np.ndarray, *, language: str | None = None) -> list[OCRLine]: ...


class TTS(Protocol):
    info: BackendInfo

    def synthesize(self, text: str, *, language: str) -> tuple[np.ndarray, int]: ...
