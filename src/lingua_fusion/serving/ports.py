"""The two ports between the stream wing and model serving, and the typed payloads that cross them.

``ModelPort`` is how a stream asks for model work; ``StageObserver`` is how serving reports what that work cost.
A stream never sees threads, batches or the scheduler; serving never sees a session. Tests fake these two
Protocols (tests/fakes.py), nothing else.

Contract of ``ModelPort.run(key, payload, ctx)``:
- ``payload`` and the result have the type of the key's task (table below, declared by ``run``'s overloads: a
  ``Request[R]`` payload gets an ``R``, a ``str`` a ``bytes``, a float32 window array (``Audio``) an ``Audio``, a
  uint8 image (``Image``) a ``list[OCRLine]``; anything else an ``object`` the caller narrows); the executor may
  batch ``payload`` with other streams' payloads for the same key and runs the batch on that model's own thread.
- Tentative work (``ctx.tentative``) may be shed by the scheduler under load: ``run`` then returns ``None``. It is
  never retried: a backend failure raises ``BackendError`` at once.
- Committed work is never shed. A backend failure (error, timeout, malformed output) is retried with backoff and
  raised as ``BackendError`` when it still fails; a full queue raises ``Overloaded``.
- Every call ends: ``run`` gives up after ``server.request_timeout_s`` whatever the backend does.
- Keys share each model fairly (``ctx.key_id``, serving/scheduler.py): one key's flood delays another key's work
  by about one batch, not by the flood.

| task | payload | result |
|---|---|---|
| vad | ``np.ndarray`` 16 kHz float32 (whole 32 ms windows) | ``np.ndarray`` speech probability per window |
| asr | ``AsrInput`` (a stream's utterance) | ``AsrOutput`` |
| asr | ``TranscribeInput`` (a piece of a file, at most ~30 s) | ``ASRResult`` (Whisper's segments, piece times) |
| asr (``ModelKey.detect()``) | ``DetectInput`` (an utterance, its candidates) | ``dict[str, float]`` (sums to 1) |
| mt | ``MtInput`` | ``str`` |
| ocr | ``np.ndarray`` uint8 RGB image, or ``OcrInput`` (an image, its language) | ``list[OCRLine]``, reading order |
| tts | ``str`` | ``bytes`` (a WAV file) |
| spk | ``SpeakerInput`` (a stretch of one voice: a file's part, a stream's utterance) | ``np.ndarray`` (windows, 256) |

File requests (lingua_fusion/files) use the same port with ``ctx.slo == FILE_CLASS``: their work waits behind live
streams' of the same key (a looser deadline), shares each model fairly with other keys, and feeds no stream SLO
breaker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ..glossary import Term
from ..models.base import ASRResult, OCRLine
from .keys import ModelKey

if TYPE_CHECKING:
    from ..tracing import TraceRef

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
Audio = npt.NDArray[np.float32]  # 16 kHz mono samples (VAD's windows), or VAD's speech probability per window
Image = npt.NDArray[np.uint8]  # an RGB picture (height, width, 3)


class Request(Generic[R_co]):
    """A payload whose result type is ``R_co``: ``ModelPort.run`` on a ``Request[R]`` returns an ``R`` (or None)."""

    __slots__ = ()


@dataclass(frozen=True)
class AsrOutput:
    text: str
    confidence: float  # 0..1, the least confident segment's


@dataclass(frozen=True)
class AsrInput(Request[AsrOutput]):
    audio: np.ndarray
    prompt: str | None = None  # context for the decoder (words on the current slide)


@dataclass(frozen=True)
class DetectInput(Request[dict[str, float]]):
    """A stream's committed utterance whose language the server is to tell (start message ``source_lang: "auto"``),
    among ``candidates``: the languages the stream may be in. Whisper scores every language it knows; only the
    candidates count, renormalised, so that a short utterance is not called Galician or Portuguese when the stream
    can only be in Spanish, English or German (stream/languages.py decides what an unsure score means)."""

    audio: np.ndarray
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class TranscribeInput(Request[ASRResult]):
    """A piece of a file's speech, transcribed with Whisper's own segments (times from the piece's start)."""

    audio: np.ndarray
    language: str | None = None  # None: Whisper detects it (ASRResult.language, language_probability)
    task: str = "transcribe"  # or "translate": Whisper's speech translation into English
    prompt: str | None = None
    hotwords: str | None = None
    # the multilingual model whatever ``language`` is: a file whose language was detected by it is transcribed by
    # it to the end (the English-only model would otherwise take the pieces after the first)
    multilingual: bool = False
    word_timestamps: bool = False  # each segment's words with their times (ASRSegment.words): an extra pass


@dataclass(frozen=True)
class OcrInput(Request[list[OCRLine]]):
    """An image to read, with the language of its text when known (Tesseract picks its model by it)."""

    image: np.ndarray
    language: str | None = None


@dataclass(frozen=True)
class SpeakerInput(Request[Audio]):
    """A stretch of one voice (a file's part of a segment, a stream's utterance; 16 kHz, its quiet frames left out):
    embedded as windows ``hop`` samples apart,
    at most ``most`` of them (models/speaker.py ``windows_of``); the result is their (n, 256) embeddings."""

    audio: np.ndarray
    hop: int = 6400
    most: int = 16


FILE_CLASS = "file"  # the work class of file requests (WORK_CLASSES)
# The service classes every caller names its work by, part of the contract: a stream's SLO class (its caption p99
# target, seconds) and, for file requests, FILE_CLASS, whose looser deadline puts a file's pieces behind a stream's
# captions of the same key.
SLO_CLASSES: dict[str, float] = {"interactive": 1.0, "standard": 3.0, "batch": 30.0}
WORK_CLASSES: dict[str, float] = {**SLO_CLASSES, FILE_CLASS: 60.0}
# share of the caption budget each stage may use (the rest is network / emit slack)
STAGE_BUDGET = {"asr": 0.6, "mt": 0.3, "tts": 0.5, "ocr": 0.5}


def stage_budget(slo: str, stage: str) -> float:
    """Seconds a stage's item of class ``slo`` may take (its share of the class's target)."""
    return WORK_CLASSES[slo] * STAGE_BUDGET.get(stage, 0.5)


def stage_deadline(slo: str, stage: str, start: float) -> float:
    """When a stage's item of class ``slo`` submitted at ``start`` is due."""
    return start + stage_budget(slo, stage)


@dataclass(frozen=True)
class MtInput(Request[str]):
    text: str
    glossary: Sequence[Term] = ()  # this item's own terms: a batch mixes streams with different glossaries
    # names on the stream's slides that this text says, kept as written; matched after the glossary, apart from
    # it, so a big glossary is compiled once per stream and not once per utterance
    names: Sequence[Term] = ()
    # whose translation memory it may use: the caller's API key id (the executor stamps it from the CallContext)
    scope: str = ""


@dataclass(frozen=True)
class CallContext:
    """Who asks, and how urgently: the scheduler's deadline is ``start`` + the stage's share of the SLO budget."""

    stream_id: str
    slo: str = "standard"
    importance: float = 0.5  # 0..1: under load, less important tentative work goes first
    tentative: bool = False
    start: float | None = None  # when the caption's clock started (the words' arrival); None: now
    key_id: str = ""  # the API key of the stream: model batches are shared fairly between keys
    # the stream's span when tracing is on (lingua_fusion/tracing): each item's stage span is recorded under it,
    # carried here explicitly because the work runs on other tasks and threads (no contextvars)
    trace: TraceRef | None = None


class ModelPort(Protocol):
    """The typed contract; implementations subclass ``TypedPort``, which declares these overloads once over one
    ``run_untyped(key, payload: object, ctx) -> object`` that dispatches on ``key``."""

    @overload
    async def run(self, key: ModelKey, payload: Request[R], ctx: CallContext) -> R | None: ...
    @overload
    async def run(self, key: ModelKey, payload: str, ctx: CallContext) -> bytes | None: ...
    @overload
    async def run(self, key: ModelKey, payload: Audio, ctx: CallContext) -> Audio | None: ...
    @overload
    async def run(self, key: ModelKey, payload: Image, ctx: CallContext) -> list[OCRLine] | None: ...
    @overload
    async def run(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        """Run ``payload`` on model ``key`` within ``ctx``'s SLO (contract in the module docstring)."""
        ...

    def depth(self, key: ModelKey) -> int:
        """Items queued for ``key`` now (for a stream's ``metrics`` events)."""
        ...


class TypedPort(ABC):
    """``ModelPort.run``'s typed face, declared once: an implementation subclasses this and writes
    ``run_untyped`` (dispatching on the key), and its callers get the overloads' result types."""

    @overload
    async def run(self, key: ModelKey, payload: Request[R], ctx: CallContext) -> R | None: ...
    @overload
    async def run(self, key: ModelKey, payload: str, ctx: CallContext) -> bytes | None: ...
    @overload
    async def run(self, key: ModelKey, payload: Audio, ctx: CallContext) -> Audio | None: ...
    @overload
    async def run(self, key: ModelKey, payload: Image, ctx: CallContext) -> list[OCRLine] | None: ...
    @overload
    async def run(self, key: ModelKey, payload: object, ctx: CallContext) -> object: ...
    async def run(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        return await self.run_untyped(key, payload, ctx)

    @abstractmethod
    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        """Run ``payload`` on model ``key`` (the contract in the module docstring); the result's type is the one
        the overloads of ``run`` name for the payload."""


class StageObserver(Protocol):
    def stage_done(self, slo: str, stage: str, seconds: float, key_id: str = "") -> None:
        """A committed item of ``key_id``'s ``stage`` took ``seconds`` from submission to result (queue wait +
        run)."""
        ...
