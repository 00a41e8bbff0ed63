"""Fakes of the stream wing's ports (serving/ports.py ModelPort, stream/session.py StreamOwner): what unit tests
of a session use instead of models; and a continuous runner (serving/threads.py ContinuousRunner) that the
executor's admission tests drive. Nothing else of the engine is faked. `make test` runs mypy on this module, so a
fake that drifts from its port (a method renamed, an attribute added to the Protocol) fails before any test runs:
see `_fakes_are_their_ports`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from lingua_fusion.config import Settings
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext, ModelPort, MtInput, TypedPort
from lingua_fusion.serving.threads import ContinuousRunner
from lingua_fusion.stream.contracts import Vocabularies
from lingua_fusion.stream.journal import StreamLog
from lingua_fusion.stream.protocol import StreamSpec
from lingua_fusion.stream.session import StreamOwner, StreamSession
from lingua_fusion.stream.wire import WireEvent


def loud_is_speech(audio: np.ndarray) -> np.ndarray:
    """VAD by loudness: the test decides where utterances are."""
    n = len(audio) // 512
    return (np.abs(audio[: n * 512]).reshape(n, 512).mean(axis=1) > 0.05).astype(np.float32)


class FakePort(TypedPort):
    """A ModelPort: MT upper-cases (text containing 'slow' takes 0.2 s, to test ordering), ASR says ``asr_text``,
    VAD is ``loud_is_speech``, OCR returns no lines. Every call is recorded as (key, payload, ctx)."""

    def __init__(self, asr_text: str = "hello there", asr_confidence: float = 0.9,
                 on_call: Callable[[ModelKey, Any], Any] | None = None) -> None:
        self.asr = AsrOutput(asr_text, asr_confidence)
        self.on_call = on_call
        self.calls: list[tuple[ModelKey, Any, CallContext]] = []

    async def run_untyped(self, key: ModelKey, payload: object, ctx: CallContext) -> object:
        self.calls.append((key, payload, ctx))
        if self.on_call is not None:
            out = self.on_call(key, payload)
            if out is not None:
                return out
        if key.task == "vad":
            assert isinstance(payload, np.ndarray)
            return loud_is_speech(payload)
        if key.task == "asr":
            assert isinstance(payload, AsrInput)
            return self.asr
        if key.task == "mt":
            assert isinstance(payload, MtInput)
            await asyncio.sleep(0.2 if "slow" in payload.text else 0.0)
            return payload.text.upper()
        if key.task == "tts":
            return b"RIFF" + b"\0" * 40
        return []

    def depth(self, key: ModelKey) -> int:
        return 0

    def count(self, task: str) -> int:
        return sum(1 for k, _, _ in self.calls if k.task == task)


class FakeOwner:
    """A StreamOwner: breaker steps switched on by hand, captions and releases recorded."""

    vocabularies: Vocabularies | None = None  # no taught signs or lips

    def __init__(self) -> None:
        self.steps: set[str] = set()
        self.captions: list[float] = []
        self.released_ids: list[str] = []

    def degraded(self, slo: str, step: str, key_id: str = "") -> bool:
        return step in self.steps

    def caption_done(self, slo: str, seconds: float, key_id: str = "") -> None:
        self.captions.append(seconds)

    def released(self, session: StreamSession) -> None:
        self.released_ids.append(session.spec.stream_id)


class SerialRunner:
    """A ContinuousRunner (serving/threads.py) that serves one item every ``per_item`` seconds (read at each item:
    a test may change it) on its own thread, after ``build_s`` seconds of building (set: ``built``); an ASR item's
    text is "<samples> samples"."""

    def __init__(self, per_item: float, build_s: float = 0.0) -> None:
        self.per_item = per_item
        self.build_s = build_s
        self.built = threading.Event()
        self._queue: deque[tuple[Any, Future[Any]]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self.held = self.most_held = 0  # items submitted and not yet answered; the most at once
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def room(self) -> int:
        return 256

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        futures: list[Future[Any]] = [Future() for _ in payloads]
        with self._cv:
            self._queue.extend(zip(payloads, futures, strict=True))
            self.held += len(payloads)
            self.most_held = max(self.most_held, self.held)
            self._cv.notify()
        return futures

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def _take(self) -> list[tuple[Any, Future[Any]]]:
        """What the next call serves (under the lock): one item."""
        return [self._queue.popleft()]

    def _seconds(self, n: int) -> float:
        return self.per_item

    def _loop(self) -> None:
        time.sleep(self.build_s)
        self.built.set()
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait(timeout=0.5)
                if self._closed:
                    return
                batch = self._take()
            time.sleep(self._seconds(len(batch)))
            with self._cv:
                self.held -= len(batch)
            for payload, future in batch:
                future.set_result(AsrOutput(f"{len(payload.audio)} samples", 0.9))


def _fakes_are_their_ports(port: FakePort, owner: FakeOwner, runner: SerialRunner
                           ) -> tuple[ModelPort, StreamOwner, ContinuousRunner]:
    """Checked by mypy, never called: each fake is assignable to the Protocol it stands in for."""
    return port, owner, runner


def session(port: FakePort | None = None, owner: FakeOwner | None = None, *, store: Any = None,
            settings: Settings | None = None, **kw: Any) -> StreamSession:
    """A session on fakes, spec en -> es unless ``spec`` is given; ``store``: a real stream store (journal on)."""
    spec = kw.pop("spec", None) or StreamSpec(source_lang="en", targets=["es"])
    return StreamSession(spec, port or FakePort(), owner or FakeOwner(), settings or Settings(),
                         log=StreamLog(store) if store is not None else None, **kw)


async def drain(s: StreamSession, wait_s: float = 5.0) -> list[WireEvent]:
    """Every event on the wire until ``closed`` (each within ``wait_s``)."""
    out: list[WireEvent] = []
    while True:
        ev = (await asyncio.wait_for(s.events.get(), timeout=wait_s)).to_wire()
        out.append(ev)
        if ev["type"] == "closed":
            return out
