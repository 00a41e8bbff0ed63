"""The serving engine as a file request reaches it: every model call of a file is work items on the engine's one
scheduler (serving/executor.py, the ``ModelPort``), beside live streams' work, and the file's worker thread waits
for their results within the request's deadline.

What a file's work gets from the engine: batching with other requests' and streams' items (MT above all), the
fairness between keys, model timeouts, retries and chaos faults, the model process under ``serve --workers`` and
the GPU runners when configured. Its items carry ``FILE_CLASS``: a looser deadline than any stream's, so they wait
behind a stream's captions of the same key, and they feed no stream's SLO breaker (serving/ports.py).

``EngineLink`` is the blocking face the file stages call from their thread (never from the loop it submits to).
The API server links the translator to its streams' port (``FileTranslator.use_engine``); a translator with no
server (the SDK's ``MultimodalTranslator.local()``, the lab) starts ``OwnEngine``: the engine's in-process
implementation (``serving.engine.in_process``) on an event loop of its own thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ..config import Settings
from ..deadline import Deadline
from ..errors import BackendError, ModelTimeout
from ..models.base import ASRResult, OCRLine
from ..models.registry import Registry
from ..models.tts import join_wavs
from ..serving.engine import in_process
from ..serving.keys import ModelKey
from ..serving.ports import FILE_CLASS, CallContext, ModelPort, MtInput, OcrInput, SpeakerInput, TranscribeInput
from ..tracing import TraceRef

T = TypeVar("T")
# a file's items in the engine's queues at once: a window of them is submitted together (so they batch) and the
# next window when it is done; with max_concurrent_requests files at once, a key's files hold at most 8 x 8 items,
# half of a model's per-key share of the queue (serving/executor.py max_queue_per_key)
WINDOW = 8


@dataclass
class FileCall:
    """Who a file request's work is for: the key whose fair share it uses, the request's deadline, and the span
    its items are recorded under (the current stage's: files/work.py ``Stages`` moves it)."""

    key_id: str = ""
    deadline: Deadline | None = None
    trace: TraceRef | None = None
    request_id: str = field(default_factory=lambda: "file:" + secrets.token_hex(6))

    def context(self) -> CallContext:
        return CallContext(stream_id=self.request_id, slo=FILE_CLASS, key_id=self.key_id, trace=self.trace)


class EngineLink:
    """Blocking calls into a ``ModelPort`` that runs on ``loop`` (another thread's)."""

    def __init__(self, port: ModelPort, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.port = port
        self.loop = loop
        self.timeout_s = timeout_s  # a call without a deadline gives up after this (server.request_timeout_s)

    def transcribe(self, key: ModelKey, pieces: Sequence[TranscribeInput], call: FileCall) -> list[ASRResult]:
        return [_typed(r, ASRResult, key) for r in self._run(key, pieces, call, "asr")]

    def translate(self, key: ModelKey, items: Sequence[MtInput], call: FileCall) -> list[str]:
        return [_typed(r, str, key) for r in self._run(key, items, call, "mt")]

    def read(self, item: OcrInput, call: FileCall) -> list[OCRLine]:
        key = ModelKey.ocr()
        (lines,) = self._run(key, [item], call, "ocr")
        return [_typed(ln, OCRLine, key) for ln in _typed(lines, list, key)]

    def speak(self, lang: str, texts: Sequence[str], call: FileCall) -> bytes:
        """Speech for ``texts`` (each a work item: another key's speech waits for one of them, not the whole
        text), as one WAV file."""
        key = ModelKey.tts(lang)
        return join_wavs([_typed(w, bytes, key) for w in self._run(key, texts, call, "tts")])

    def embed_speakers(self, items: Sequence[SpeakerInput], call: FileCall) -> list[np.ndarray]:
        """Each stretch of voice's window embeddings ((windows, 256) each): one work item per stretch, a batch of
        them one forward of the voice encoder."""
        key = ModelKey.spk()
        return [_typed(r, np.ndarray, key) for r in self._run(key, items, call, "diarize")]

    def _run(self, key: ModelKey, payloads: Sequence[object], call: FileCall, stage: str) -> list[object]:
        ctx = call.context()
        out: list[object] = []
        for i in range(0, len(payloads), WINDOW):
            window = payloads[i:i + WINDOW]
            out += self._wait(_gather(self.port, key, window, ctx), call, stage)
        return out

    def _wait(self, coro: Coroutine[object, object, list[object]], call: FileCall, stage: str) -> list[object]:
        if call.deadline is not None:
            call.deadline.check(stage)  # RequestTimeout (504) once the request is past its time
        if _running_loop() is self.loop:
            coro.close()
            raise RuntimeError("a file's model call must not run on the engine's own event loop")
        wait_s = self.timeout_s if call.deadline is None else min(self.timeout_s, max(0.0, call.deadline.left()))
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()  # the items leave the queues (Executor._result withdraws a cancelled caller's item)
            if call.deadline is not None:
                call.deadline.check(stage)
            raise ModelTimeout(f"{stage} gave no result in {wait_s:.0f} s") from None
        except concurrent.futures.CancelledError:
            raise BackendError(f"{stage} was cancelled: the server is stopping") from None


async def _gather(port: ModelPort, key: ModelKey, payloads: Sequence[object], ctx: CallContext) -> list[object]:
    results = await asyncio.gather(*(port.run(key, p, ctx) for p in payloads))
    if any(r is None for r in results):  # committed work is never shed; None means the engine dropped it
        raise BackendError(f"{key} dropped a file's work (the server is stopping)")
    return list(results)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _typed(value: object, kind: type[T], key: ModelKey) -> T:
    if not isinstance(value, kind):
        raise BackendError(f"{key} answered a {type(value).__name__} where a {kind.__name__} was due")
    return value


class OwnEngine:
    """An engine for a translator with no server: an ``Executor`` over ``registry`` on an event loop of its own
    thread, closed with the translator."""

    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="file-engine", daemon=True)
        self._thread.start()
        self.executor = in_process(registry, settings)
        self.link = EngineLink(self.executor, self.loop, settings.server.request_timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.executor.close(), self.loop).result(timeout=30)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # a model thread that does not stop is abandoned with the daemon thread
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
