"""What one file request carries between its stages: ``Work`` (what it learns on its way) and ``Stages``
(per-stage latency, the deadline checked as each stage starts, a trace span per stage)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..deadline import Deadline
from ..models.routes import MTRoute
from ..tracing import TraceRef, span
from .engine import FileCall

if TYPE_CHECKING:
    from ..video.file_video import VideoRead
    from ..vision.service import GlossSpan


@dataclass
class Work:
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
    video: VideoRead | None = None  # the slides read from a video's frames (ASR and MT context)
    signs: list[GlossSpan] = field(default_factory=list)  # signs read (vocabulary_id)
    # Chinese scripts asked for by the request's language tags (zh-TW, zh-Hant: "Hant"; zh: "Hans"), or None
    source_script: str | None = None
    target_script: str | None = None
    untranslated: list[str] = field(default_factory=list)  # words MT left as written (lingua_fusion/untranslated.py)
    slide_context: bool = True  # FileTranslator.slide_context when the request started: slide words feed ASR, MT
    word_timestamps: bool = False  # the request asked for each segment's words (FileRequest.word_timestamps)
    # the engine's view of this request: its key (and translation memory), its deadline (optional work, the slide
    # corrections, stops early near it), its current span
    call: FileCall = field(default_factory=FileCall)


class Stages:
    """Per-stage latency, and the request's deadline checked as each stage starts."""

    def __init__(self, deadline: Deadline | None = None, trace: TraceRef | None = None,
                 call: FileCall | None = None) -> None:
        self.ms: dict[str, float] = {}
        self._t0 = time.perf_counter()
        self.deadline = deadline
        self.trace = trace  # the request's span (tracing on): each stage is a child span
        self.call = call  # its engine calls: their items are recorded under the stage that makes them

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.deadline is not None:
            self.deadline.check(name)  # RequestTimeout (504): the thread stops here instead of finishing late
        t = time.perf_counter()
        try:
            with span(self.trace, name) as child:
                outer = self.call.trace if self.call is not None else None
                if self.call is not None and child is not None:
                    self.call.trace = child
                try:
                    yield
                finally:
                    if self.call is not None:
                        self.call.trace = outer
        finally:
            self.ms[name] = round(self.ms.get(name, 0.0) + (time.perf_counter() - t) * 1000, 2)

    def total(self) -> dict[str, float]:
        return {**self.ms, "total": round((time.perf_counter() - self._t0) * 1000, 2)}
