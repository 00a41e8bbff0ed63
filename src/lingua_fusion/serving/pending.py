"""What the executor holds for each item it was handed, and the small steps of settling one: pure data and
functions, no scheduling (serving/executor.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sized
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ..errors import BackendError, LinguaFusionError
from ..tracing import TraceRef, record_batch
from .keys import ModelKey
from .scheduler import WorkItem

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.serving")
T = TypeVar("T")


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


def vad_seconds(audio: object) -> float:
    """A VAD item's seconds of 16 kHz audio (its share of a VAD call)."""
    return len(audio) / 16000 if isinstance(audio, Sized) else 0.0


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
