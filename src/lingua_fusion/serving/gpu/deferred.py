"""A continuous runner built on a thread of its own, so the event loop never waits for it.

The executor makes a model's runner at the first call for it, on the event loop (admission asks for it when a
stream opens). A GpuRunner's making is long: the weights read and moved to the device, the pools allocated, and on
CUDA the encoder's graphs captured (about 20 s for Whisper base). Done there, every other stream on the loop would
stall for all of it. ``DeferredRunner(build, name)`` starts ``build()`` on its own thread and answers for the runner
meanwhile: no room until it is built (the work stays in the scheduler, where deadlines and shedding apply, and the
executor's worker looks again within half a second), then everything is the built runner's. If the build fails, each
item handed to it fails with a BackendError that says why (logged once), instead of waiting for ever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ...errors import BackendError

log = logging.getLogger("lingua_fusion.gpu")

CLOSE_WAIT_S = 120.0  # close() waits this long for a build still running before leaving it to finish alone


class DeferredRunner:
    def __init__(self, build: Callable[[], Any], name: str) -> None:
        self.name = name
        self._build = build
        self._runner: Any = None  # a ContinuousRunner (serving/runners.py), once built
        self._error: BackendError | None = None
        self._thread = threading.Thread(target=self._run, name=f"build-{name}", daemon=True)
        self._thread.start()

    @property
    def built(self) -> Any:
        """The runner ``build`` made; None while it is building or if it failed."""
        return self._runner

    def _run(self) -> None:
        try:
            runner = self._build()
        except Exception as exc:  # an out-of-memory, weights that do not load, a capture CUDA refuses
            log.exception("%s: the GPU runner could not be built", self.name)
            self._error = BackendError(f"{self.name} could not start on the GPU engine: {type(exc).__name__}: {exc}")
        else:
            self._runner = runner
            log.info("%s: GPU runner ready", self.name)

    # ---- ContinuousRunner ---------------------------------------------------------------------------------
    def room(self) -> int:
        if self._runner is not None:
            return int(self._runner.room())
        return 1 << 20 if self._error is not None else 0  # failed: take the work, to fail it at once

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        if self._runner is not None:
            return list(self._runner.submit(payloads, tentative))
        error = self._error or BackendError(f"{self.name} is still starting")
        futures: list[Future[Any]] = []
        for _ in payloads:
            failed: Future[Any] = Future()
            failed.set_exception(error)
            futures.append(failed)
        return futures

    @property
    def memory(self) -> Any:
        """The built runner's pools (serving/gpu/memory.py MemoryReport), None before."""
        return getattr(self._runner, "memory", None)

    def close(self) -> None:
        self._thread.join(timeout=CLOSE_WAIT_S)
        if self._thread.is_alive():
            log.warning("%s: still building after %.0f s at shutdown; left to finish alone", self.name, CLOSE_WAIT_S)
        if self._runner is not None and hasattr(self._runner, "close"):
            self._runner.close()
