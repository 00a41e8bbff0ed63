"""Model threads: each model key runs its batches on threads of its own, with a timeout and an output check.

A key has as many threads as it has lanes (batches that may run at once: ``lanes_for``, 1 for most models; Whisper
through CTranslate2 ``models.asr_parallel``).

A backend that hangs past its timeout is abandoned with its thread (which ends on its own) instead of blocking the
executor everything else uses; after ``MAX_HUNG`` stuck threads that model fails fast. Chaos faults (server started
with ``--chaos``) are applied here, so everything above sees them exactly as it would see a real broken backend.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import BackendError, InjectedFault, LinguaFusionError, ModelTimeout
from .faults import Fault, check_outputs, delay_of, garble, pick
from .keys import ModelKey
from .runners import Runner

if TYPE_CHECKING:
    from ..observability import Metrics

MAX_HUNG = 2  # threads of one model stuck past their timeout before its calls fail fast
COLD_TIMEOUT_S = 120.0  # a model's first batch may include loading it


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
        output that cannot be a caption."""
        loop = asyncio.get_running_loop()
        out: asyncio.Future[list[object]] = loop.create_future()
        fault = pick(self.faults, str(key), self._rng) if self.faults else None
        if fault is not None and fault.kind == "error":
            out.set_exception(InjectedFault(f"chaos: injected failure of {key}"))
        elif fault is not None and fault.kind == "delay":  # a slow answer: the thread is not held meanwhile
            loop.call_later(delay_of(fault, self._rng), self._launch, key, runner, payloads, fault, out)
        else:
            self._launch(key, runner, payloads, fault, out)
        return out

    def _launch(self, key: ModelKey, runner: Runner, payloads: list[object], fault: Fault | None,
                out: asyncio.Future[list[object]]) -> None:
        if out.done():
            return
        hung = self._hung.get(key, 0)
        if hung >= MAX_HUNG:
            out.set_exception(BackendError(f"{key} is not answering ({hung} calls stuck past their timeout); "
                                           "failing fast"))
            return

        def work() -> Sequence[object]:
            if fault is not None and fault.kind == "hang":
                time.sleep(fault.delay_s)  # chaos: a wedged backend (the thread is abandoned, then ends)
            return runner(payloads)

        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ThreadPoolExecutor(max_workers=max(1, self._lanes_for(key)),
                                                         thread_name_prefix=f"model-{key}")
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(pool, work)
        timeout = self._timeout_for(key, payloads, key in self.warm)
        timer = loop.call_later(timeout, self._expired, key, pool, running, out, timeout, len(payloads))
        running.add_done_callback(functools.partial(self._ran, key, payloads, fault, timer, out))

    def _expired(self, key: ModelKey, pool: ThreadPoolExecutor, running: asyncio.Future[Sequence[object]],
                 out: asyncio.Future[list[object]], timeout: float, n: int) -> None:
        """On the loop: a batch still running at its timeout is abandoned with its thread."""
        if running.done() or out.done():
            return
        self._abandon(key, pool, running)
        out.set_exception(ModelTimeout(f"{key} did not answer a batch of {n} in {timeout:.0f} s"))

    def _ran(self, key: ModelKey, payloads: list[object], fault: Fault | None, timer: asyncio.TimerHandle,
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
        results = running.result()
        if fault is not None and fault.kind == "garbage":
            results = garble(str(key), results, self._rng)
        try:
            checked = check_outputs(key, payloads, results)
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
