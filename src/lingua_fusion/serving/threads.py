"""Model calls off the event loop and back, below the executor's scheduling (serving/executor.py decides what runs
when): what a model key's batch runs, the threads it runs on, and what an item carries while it is away and how it
settles on the loop when its call is done.

Runners: one function per model key that turns a list of typed payloads (the ports' table, serving/ports.py) into a
list of typed results (``build_runner``); ``per_stream`` is the benchmark baseline: one item per call through
faster-whisper's own 30 s-window decode, as whisper_streaming and WhisperLive do. A continuous runner (serving/gpu)
batches on its own thread and is handed items as they are scheduled.

Threads: each model key runs its batches on threads of its own, as many as it has lanes (batches that may run at
once: ``lanes_of``, 1 for most models; Whisper through CTranslate2 ``models.asr_parallel``). A backend that hangs
past its timeout is abandoned with its thread (which ends on its own) instead of blocking the executor everything
else uses; after ``MAX_HUNG`` stuck threads that model fails fast. Every batch's results pass the output check
(``check_outputs``): a backend that returns what cannot be a caption (a broken model directory, a library bug)
fails its batch instead of reaching one. While chaos faults are set (server started with ``--chaos``) a batch is
started through serving/faults.py ``with_faults``; otherwise it does not cross that module.

Settling: every item the executor is handed carries a ``Pending`` (its payload, its caller's future, its trace); a
runner's future is settled on the loop (``on_loop``); a finished call's failure is typed once (``failure_of``) and
a failed batch's callers each get it (``fail``). Pure data and small functions, no scheduling.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import numpy as np

from ..config import Settings
from ..errors import BackendError, LinguaFusionError, MalformedOutput, ModelTimeout
from ..glossary import apply_mt_batch
from ..models.base import ASRResult, OCRLine, among
from ..models.registry import Registry
from ..models.transcript_guard import guard_text
from ..tracing import TraceRef, record_batch
from .faults import Fault, with_faults
from .keys import ModelKey
from .ports import AsrInput, AsrOutput, DetectInput, MtInput, OcrInput, SpeakerInput, TranscribeInput
from .scheduler import WorkItem

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.serving")
T = TypeVar("T")
U = TypeVar("U")
# a batch of a key's payloads (the ports' types: serving/ports.py) -> their results, in order
Runner = Callable[[list[object]], Sequence[object]]
MAX_HUNG = 2  # threads of one model stuck past their timeout before its calls fail fast
COLD_TIMEOUT_S = 120.0  # a model's first batch may include loading it


def batch_timeout(settings: Settings, predicted: float, payloads: Sequence[object], warm: bool) -> float:
    """Seconds a batch of ``payloads`` may run before it is abandoned, ``predicted``: its cost model's latency."""
    base = settings.server.model_timeout_s
    # a file's piece of speech may take up to its own length on a loaded CPU (it has no cost model)
    speech = sum(len(p.audio) / 16000 for p in payloads if isinstance(p, TranscribeInput))
    if not warm:
        return max(base, COLD_TIMEOUT_S, speech)
    return max(base, settings.server.model_timeout_factor * predicted, speech)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


# ---- runners -----------------------------------------------------------------------------------------------------
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


@runtime_checkable
class BusyCounted(Protocol):
    """A continuous runner that counts the seconds its thread has been busy (serving/gpu/runner.py GpuRunner)."""

    def busy_s(self) -> float: ...


def busy_seconds(runner: object) -> float | None:
    """``runner``'s busy seconds so far; None where it does not count them (admission's BusyPace then waits)."""
    return runner.busy_s() if isinstance(runner, BusyCounted) else None


@runtime_checkable
class StepProfiled(Protocol):
    """A continuous runner that timed its decode step at each batch size on its device (serving/gpu/runner.py
    GpuRunner, from its CUDA graphs): admission extrapolates its latency by them (service_curve.ServiceCurve.shape)."""

    def step_profile(self) -> tuple[tuple[int, float], ...]: ...


def step_profile(runner: object) -> tuple[tuple[int, float], ...]:
    """``runner``'s (batch size, step seconds), ascending; empty where it timed none (no graphs, not built yet)."""
    return runner.step_profile() if isinstance(runner, StepProfiled) else ()


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
        # the scheduler gives a file's piece a batch of its own (serving/demand.py ASR_MAX_UNITS); a mixed batch
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


# ---- threads -----------------------------------------------------------------------------------------------------
class ModelThreads:
    def __init__(self, timeout_for: Callable[[ModelKey, list[object], bool], float], metrics: Metrics | None = None,
                 lanes_for: Callable[[ModelKey], int] | None = None) -> None:
        self._timeout_for = timeout_for  # (key, the batch's payloads, warm) -> seconds
        self._lanes_for = lanes_for or (lambda key: 1)  # key -> batches of it that run at once (its threads)
        self.metrics = metrics
        self.faults: dict[str, Fault] = {}  # chaos: "model/kind" -> fault
        self._rng = random.Random(0)
        self._pools: dict[ModelKey, ThreadPoolExecutor] = {}
        self._hung: dict[ModelKey, int] = {}
        self.warm: set[ModelKey] = set()

    def start(self, key: ModelKey, runner: Runner, payloads: list[object]) -> asyncio.Future[list[object]]:
        """One batch started on ``key``'s thread now. Its future (settled on the loop, no task between) holds the
        results, or the BackendError (or a subclass) of a backend that failed, hung past its timeout or returned
        output that cannot be a caption. Through the chaos faults while any is set (serving/faults.py)."""
        if self.faults:
            return with_faults(self.launch, self.faults, self._rng)(key, runner, payloads)
        return self.launch(key, runner, payloads)

    def launch(self, key: ModelKey, runner: Runner, payloads: list[object]) -> asyncio.Future[list[object]]:
        """``start`` without chaos: the batch on ``key``'s pool, a timer for its timeout, its results checked."""
        loop = asyncio.get_running_loop()
        out: asyncio.Future[list[object]] = loop.create_future()
        hung = self._hung.get(key, 0)
        if hung >= MAX_HUNG:
            out.set_exception(BackendError(f"{key} is not answering ({hung} calls stuck past their timeout); "
                                           "failing fast"))
            return out
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ThreadPoolExecutor(max_workers=max(1, self._lanes_for(key)),
                                                         thread_name_prefix=f"model-{key}")
        running = loop.run_in_executor(pool, runner, payloads)
        timeout = self._timeout_for(key, payloads, key in self.warm)
        timer = loop.call_later(timeout, self._expired, key, pool, running, out, timeout, len(payloads))
        running.add_done_callback(functools.partial(self._ran, key, payloads, timer, out))
        return out

    def _expired(self, key: ModelKey, pool: ThreadPoolExecutor, running: asyncio.Future[Sequence[object]],
                 out: asyncio.Future[list[object]], timeout: float, n: int) -> None:
        """On the loop: a batch still running at its timeout is abandoned with its thread."""
        if running.done() or out.done():
            return
        self._abandon(key, pool, running)
        out.set_exception(ModelTimeout(f"{key} did not answer a batch of {n} in {timeout:.0f} s"))

    def _ran(self, key: ModelKey, payloads: list[object], timer: asyncio.TimerHandle,
             out: asyncio.Future[list[object]], running: asyncio.Future[Sequence[object]]) -> None:
        """On the loop: a batch's thread returned; its results checked into ``out``."""
        timer.cancel()
        if out.done():  # abandoned at its timeout (or the caller is gone): its late answer is dropped
            return
        if running.cancelled():
            out.cancel()
            return
        exc = running.exception()
        if exc is not None:
            if not isinstance(exc, LinguaFusionError):  # a library failure inside the backend
                failed = BackendError(f"{key} failed: {type(exc).__name__}: {exc}")
                failed.__cause__ = exc
                exc = failed
            out.set_exception(exc)
            return
        try:
            checked = check_outputs(key, payloads, running.result())
        except LinguaFusionError as bad:
            out.set_exception(bad)
            return
        self.warm.add(key)
        out.set_result(list(checked))

    def stuck(self) -> dict[str, int]:
        """Abandoned calls still running, per model key (they fail that model fast at ``MAX_HUNG``)."""
        return {str(k): n for k, n in self._hung.items() if n}

    def _abandon(self, key: ModelKey, pool: ThreadPoolExecutor, running: asyncio.Future[Sequence[object]]) -> None:
        self._hung[key] = self._hung.get(key, 0) + 1  # read again: one may have returned meanwhile
        # the stuck thread's pool takes no more work (its other lanes' calls finish on it); the next call gets a
        # fresh pool. Another lane may have replaced it already: that newer pool stays.
        if self._pools.get(key) is pool:
            del self._pools[key]
        pool.shutdown(wait=False)

        def unstuck(f: asyncio.Future[Sequence[object]]) -> None:
            self._hung[key] = max(0, self._hung.get(key, 1) - 1)
            if not f.cancelled():
                f.exception()  # retrieved: a late failure of an abandoned call is not an unhandled error

        running.add_done_callback(unstuck)
        if self.metrics is not None:
            self.metrics.model_timeouts.labels(model=str(key)).inc()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False)
        self._pools.clear()


def lanes_of(key: ModelKey, settings: Settings) -> int:
    """Whisper through CTranslate2 runs ``models.asr_parallel`` batches at once (its WhisperASR has that many
    CTranslate2 workers); every other model (and the torch backend, whose threads are process-wide) one."""
    m = settings.models
    if key.task == "asr" and m.backend == "ctranslate2" and m.engine == "":
        return m.asr_lanes()
    return 1


# ---- the output check --------------------------------------------------------------------------------------------
def _text_ok(text: object, limit: int) -> bool:
    return isinstance(text, str) and len(text) <= limit and not _CONTROL.search(text)


def check_outputs(key: ModelKey, args: list[object], results: object) -> list[object]:
    """Reject a batch whose outputs cannot be captions: raises MalformedOutput, returns the list otherwise."""
    if not isinstance(results, list) or len(results) != len(args):
        raise MalformedOutput(f"{key} returned {len(results) if isinstance(results, list) else type(results).__name__}"
                              f" outputs for {len(args)} inputs")
    for arg, r in zip(args, results, strict=True):
        if key.task == "asr" and isinstance(arg, TranscribeInput):  # a file's piece: Whisper's segments
            ok = isinstance(r, ASRResult) and _text_ok(r.text, 40 * len(arg.audio) // 16000 + 4000) and all(
                _confidence_ok(s.confidence) and math.isfinite(s.start) and s.start <= s.end
                and all(math.isfinite(w.start) and w.start <= w.end for w in s.words) for s in r.segments)
        elif isinstance(arg, DetectInput):  # each candidate's probability, nothing else
            ok = isinstance(r, dict) and set(r) == set(arg.candidates) and all(
                isinstance(p, float) and 0.0 <= p <= 1.0 for p in r.values())
        elif key.task == "asr":
            ok = isinstance(r, AsrOutput) and _text_ok(r.text, 4000) and _confidence_ok(r.confidence)
        elif key.task == "mt":
            ok = isinstance(arg, MtInput) and _text_ok(r, 10 * len(arg.text) + 200)
        elif key.task == "ocr":
            ok = isinstance(r, list) and all(isinstance(x, OCRLine) and _text_ok(x.text, 4000) for x in r)
        elif key.task == "tts":
            ok = isinstance(r, (bytes, bytearray)) and r[:4] == b"RIFF"
        else:
            ok = isinstance(r, np.ndarray) and bool(np.all(np.isfinite(r)))
        if not ok:
            raise MalformedOutput(f"{key} returned malformed output ({str(r)[:60]!r})")
    return results


def _confidence_ok(c: object) -> bool:
    return isinstance(c, (int, float)) and math.isfinite(c) and -1e-6 <= c <= 1 + 1e-6


# ---- settling ----------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Flight:
    """One batch in flight on a lane; ``overlapped`` once another batch of its model ran during it."""

    overlapped: bool = False


@dataclass
class Pending:
    payload: object
    future: asyncio.Future[object]
    enqueued: float = field(default_factory=time.monotonic)
    key_id: str = ""  # the VAD lane's unit of fairness
    trace: TraceRef | None = None  # the caller's span (tracing on): this item's stage span is recorded under it


def on_loop(loop: asyncio.AbstractEventLoop, settle: Callable[[Future[object]], None]
             ) -> Callable[[Future[object]], object]:
    """A done-callback for a runner's future (called on the runner's thread) that runs ``settle`` on ``loop``."""
    return lambda done: loop.call_soon_threadsafe(settle, done)


def pending_of(w: WorkItem[ModelKey]) -> Pending:
    """The executor's own part of a scheduled item (every item it submits carries one as its payload)."""
    assert isinstance(w.payload, Pending)
    return w.payload


def resolve(fut: asyncio.Future[object], value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def failure_of(key: ModelKey, done: asyncio.Future[T] | Future[T]) -> LinguaFusionError | None:
    """What a finished model call (a batch's, or a continuous runner's item) failed with, typed; None when it
    succeeded. The model threads type a backend's own errors already; a runner's item may raise anything."""
    if done.cancelled():
        return BackendError(f"{key} was cancelled")
    exc = done.exception()
    if exc is None or isinstance(exc, LinguaFusionError):
        return exc
    return BackendError(f"{key} failed: {exc}")


def fail(key: ModelKey, items: list[Pending], exc: LinguaFusionError, t0: float | None, now: float,
         metrics: Metrics | None) -> None:
    """A batch failed (or one continuous item): each item's caller gets ``exc``; logged, traced, counted."""
    log.warning("model %s failed on a batch of %d: %s", key, len(items), exc.message)
    record_batch(key, key.stage, [(p.trace, p.enqueued, None) for p in items], t0, now, exc)
    if metrics is not None:
        metrics.model_failures.labels(model=str(key), code=exc.code).inc()
    for p in items:
        if not p.future.done():
            p.future.set_exception(exc)
