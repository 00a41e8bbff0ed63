"""A continuous runner built on a thread of its own, so the event loop never waits for it.

The executor makes a model's runner at the first call for it, on the event loop (admission asks for it when a
stream opens). A GpuRunner's making is long: the weights read and moved to the device, the pools allocated, and on
CUDA with ``models.encoder_graphs`` the encoder's graphs captured (about 20 s for Whisper base). Done there, every
other stream on the loop would stall for all of it. ``DeferredRunner(build, name)`` starts ``build()`` on its own
thread and answers for the runner meanwhile: no room until it is built (the work waits in the scheduler; the
executor sheds partials that can no longer meet their deadlines and looks again within half a second), then
everything is the built runner's.

Builds run one at a time in the process: each sizes its pools from the GPU memory free when it starts, so two at once
would both count the same free memory. A build that fails (an out-of-memory while other processes start, weights
that do not load) fails each item handed to it with a BackendError that says why, at once instead of leaving it
waiting, and is tried again after a back-off (30 s, doubling to 10 min): a passing shortage heals itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ...errors import BackendError
from ..threads import ContinuousRunner, busy_seconds, step_profile

if TYPE_CHECKING:
    from .memory import MemoryReport

log = logging.getLogger("lingua_fusion.gpu")

RETRY_S = (30.0, 600.0)  # a failed build is tried again after the first, doubling up to the second
_BUILDS = threading.Lock()  # one build at a time in the process (each sizes its pools from the free memory)


@runtime_checkable
class ReportsMemory(Protocol):
    """A runner that publishes its pools (GpuRunner.memory)."""

    memory: MemoryReport | None


@runtime_checkable
class Starting(Protocol):
    """A runner built in the background (DeferredRunner): "ready", "building" or "failed: why"."""

    @property
    def state(self) -> str: ...


class DeferredRunner:
    def __init__(self, build: Callable[[], ContinuousRunner], name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._build = build
        self._clock = clock
        self._lock = threading.Lock()
        self._runner: ContinuousRunner | None = None  # once built
        self._error: BackendError | None = None
        self._retry_at = 0.0
        self._failures = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start()

    @property
    def built(self) -> ContinuousRunner | None:
        """The runner ``build`` made; None while it is building, or failed."""
        return self._runner

    @property
    def state(self) -> str:
        """"ready", "building", or "failed: why" (the last build's error, until its retry starts)."""
        with self._lock:
            if self._runner is not None:
                return "ready"
            return "building" if self._error is None else f"failed: {self._error.message}"

    def _start(self) -> None:
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"build-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with _BUILDS:
                if self._closed:
                    return
                runner = self._build()
        except BaseException as exc:  # an out-of-memory, weights that do not load, a capture CUDA refuses
            self._failures += 1
            wait_s = min(RETRY_S[1], RETRY_S[0] * 2 ** (self._failures - 1))
            log.exception("%s: the GPU runner could not be built; trying again in %.0f s", self.name, wait_s)
            with self._lock:
                self._retry_at = self._clock() + wait_s
                self._error = BackendError(f"{self.name} could not start on the GPU engine: "
                                           f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            if not self._closed:
                self._runner = runner
                log.info("%s: GPU runner ready", self.name)
                return
        runner.close()  # closed while it was being built: nobody will use it

    def _failed(self) -> BackendError | None:
        """The last build's error while it stands; past its back-off, a new build is started and None returned."""
        with self._lock:
            if self._error is None or self._closed:
                return self._error
            if self._clock() < self._retry_at:
                return self._error
            self._start()
            return None

    # ---- ContinuousRunner ---------------------------------------------------------------------------------
    def room(self) -> int:
        if self._runner is not None:
            return int(self._runner.room())
        return 1 << 20 if self._failed() is not None else 0  # failed: take the work, to fail it at once

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        if self._runner is not None:
            return list(self._runner.submit(payloads, tentative))
        error = self._failed() or BackendError(f"{self.name} is still starting")
        futures: list[Future[Any]] = []
        for _ in payloads:
            failed: Future[Any] = Future()
            failed.set_exception(error)
            futures.append(failed)
        return futures

    def busy_s(self) -> float:
        """The built runner's busy seconds (serving/threads.py BusyCounted); 0 before it is built."""
        seconds = busy_seconds(self._runner)
        return 0.0 if seconds is None else seconds

    def step_profile(self) -> tuple[tuple[int, float], ...]:
        """The built runner's step seconds per batch size (serving/threads.py StepProfiled); none before."""
        return step_profile(self._runner)

    @property
    def memory(self) -> MemoryReport | None:
        """The built runner's pools (serving/gpu/memory.py MemoryReport), None before (or for a runner that
        reports none)."""
        runner = self._runner
        return runner.memory if isinstance(runner, ReportsMemory) else None

    def close(self) -> None:
        """Close the built runner; a build still running closes what it makes when it ends (nobody waits for it)."""
        with self._lock:
            self._closed = True
            runner = self._runner
        if runner is not None:
            runner.close()
