"""Batch runners: one function per model key that turns a list of typed payloads into a list of typed results.

They run on the model's own thread (serving/threads.py), never on the event loop. ``per_stream`` is the
benchmark baseline: one item per call through faster-whisper's own 30 s-window decode, as whisper_streaming and
WhisperLive do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from ..glossary import apply_mt_batch
from ..models.base import ASRResult, OCRLine, among
from ..models.registry import Registry
from ..models.transcript_guard import guard_text
from .keys import ModelKey
from .ports import AsrInput, AsrOutput, DetectInput, MtInput, OcrInput, SpeakerInput, TranscribeInput

T = TypeVar("T")
U = TypeVar("U")
# a batch of a key's payloads (the ports' types: serving/ports.py) -> their results, in order
Runner = Callable[[list[object]], Sequence[object]]


@runtime_checkable
class ContinuousRunner(Protocol):
    """A backend that batches on its own, continuously (serving/gpu: sequences join and leave its running batch at
    every decoder step): the executor hands it work as it is scheduled and does not wait for a batch to end."""

    def room(self) -> int:
        """How many more items it takes now (its own waiting queue is bounded)."""
        ...

    def submit(self, payloads: list[object], tentative: list[bool]) -> list[Future[object]]:
        """Queue ``payloads`` (tentative ones are preempted first under memory pressure); each future resolves (on
        the runner's thread) to its result or exception."""
        ...

    def close(self) -> None:
        """Stop its thread; items still queued fail (the executor is closing)."""
        ...


def build_runner(key: ModelKey, registry: Registry, *, per_stream: bool = False) -> Runner:
    if key == ModelKey.detect():
        return lambda items: _detect(registry, payloads_of(items, DetectInput))
    if key.task == "asr":
        return _asr(registry, key.source, per_stream)
    if key.task == "mt":
        return _mt(registry, key.source, key.target)
    if key.task == "ocr":
        return lambda images: [_read(registry, img) for img in _either(images, np.ndarray, OcrInput)]
    if key.task == "tts":
        return lambda texts: [registry.speak_wav(text, key.source) for text in payloads_of(texts, str)]
    if key.task == "spk":
        return lambda stretches: _embed(registry, payloads_of(stretches, SpeakerInput))
    return lambda windows: [registry.vad().probabilities(audio) for audio in payloads_of(windows, np.ndarray)]


def _detect(registry: Registry, items: list[DetectInput]) -> list[dict[str, float]]:
    """Every stream's utterance in one language identification call on the multilingual Whisper, scored over the
    union of their candidates, then each over its own (renormalising a renormalised subset keeps its ratios)."""
    union = sorted({c for it in items for c in it.candidates})
    scored = registry.asr(None).detect_batch([it.audio for it in items], union) if items else []
    return [among(probs, it.candidates) for it, probs in zip(items, scored, strict=True)]


def _embed(registry: Registry, items: list[SpeakerInput]) -> list[np.ndarray]:
    """Every window of every item in the batch through the voice encoder in one forward (models/speaker.py
    bounds a forward's windows), split back per item."""
    from ..models.speaker import windows_of

    windows = [windows_of(it.audio, it.hop, it.most) for it in items]
    embedded = registry.speaker().embed(np.concatenate(windows)) if windows else np.zeros((0, 0), np.float32)
    bounds = np.cumsum([0, *(len(w) for w in windows)])
    return [embedded[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _read(registry: Registry, item: np.ndarray | OcrInput) -> list[OCRLine]:
    if isinstance(item, OcrInput):
        return registry.ocr().recognize(item.image, language=item.language)
    return registry.ocr().recognize(item)


def _asr(registry: Registry, lang: str, per_stream: bool) -> Runner:
    def utterances(items: list[AsrInput]) -> list[AsrOutput]:
        asr = registry.asr(lang)
        if per_stream:
            pairs = []
            for it in items:
                r = asr.transcribe(it.audio, language=lang, initial_prompt=it.prompt)
                pairs.append((r.text, min((s.confidence for s in r.segments), default=0.0)))
        else:
            pairs = asr.transcribe_batch([it.audio for it in items], language=lang,
                                         prompts=[it.prompt for it in items])
        # loops cut; Mandarin as Whisper wrote it: the stream writes it in the script its tag asked for (jobs.py)
        return [AsrOutput(*guard_text(text, conf, None)) for text, conf in pairs]

    def piece(it: TranscribeInput) -> ASRResult:  # a file's piece: Whisper's own segments and timestamps
        asr = registry.asr(None if it.multilingual else it.language, task=it.task)
        result: ASRResult = asr.transcribe(it.audio, language=it.language, task=it.task, initial_prompt=it.prompt,
                                           hotwords=it.hotwords, word_timestamps=it.word_timestamps)
        return result

    def run(batch: list[object]) -> list[AsrOutput | ASRResult]:
        items = _either(batch, AsrInput, TranscribeInput)
        # the scheduler gives a file's piece a batch of its own (serving/executor.py ASR_MAX_UNITS); a mixed batch
        # (a test's) still answers every item in order
        out: list[AsrOutput | ASRResult | None] = [None] * len(items)
        streams = [(i, it) for i, it in enumerate(items) if isinstance(it, AsrInput)]
        for (i, _it), res in zip(streams, utterances([it for _i, it in streams]) if streams else [], strict=True):
            out[i] = res
        for i, it in enumerate(items):
            if isinstance(it, TranscribeInput):
                out[i] = piece(it)
        return [r for r in out if r is not None]

    return run


def _mt(registry: Registry, src: str, tgt: str) -> Runner:
    def run(batch: list[object]) -> list[str]:
        items = payloads_of(batch, MtInput)
        route = registry.mt_route(src, tgt)
        translate = registry.route_translator(route)
        texts, terms, names = [it.text for it in items], [it.glossary for it in items], [it.names for it in items]
        tm = registry.translation_memory()  # repeated phrases, the same deck in several rooms: MT once
        if tm is not None:
            return list(tm.translate(registry.route_key(route), texts, terms, translate, names=names,
                                     scopes=[it.scope for it in items])[0])
        outs, _ = apply_mt_batch(texts, terms, translate, names=names)
        return outs

    return run



def payloads_of(items: list[object], kind: type[T]) -> list[T]:
    """``items`` as the payloads of their key's task (the ports' table): a payload of another type is the caller's
    bug, a TypeError (the batch fails as a BackendError) rather than an AttributeError deeper in the backend."""
    out: list[T] = []
    for it in items:
        if not isinstance(it, kind):
            raise TypeError(f"a {type(it).__name__} payload where a {kind.__name__} was due")
        out.append(it)
    return out


def _either(items: list[object], one: type[T], other: type[U]) -> list[T | U]:
    """``items`` as payloads of one of two types (``payloads_of``)."""
    out: list[T | U] = []
    for it in items:
        if not isinstance(it, (one, other)):
            raise TypeError(f"a {type(it).__name__} payload where a {one.__name__} or {other.__name__} was due")
        out.append(it)
    return out
