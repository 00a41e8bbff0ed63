"""The frame side of a live stream's landmark reader (signs: ``stream_signs.py``, lips: ``stream_lips.py``).

``offer`` runs in the worker thread that decoded the frame; the adaptive sampler (``sampler.py``) decides whether to
analyse it, within the stream's frame budget. Frames to analyse go to the event loop (``call_soon_threadsafe``) into a
bounded queue (``MAX_QUEUED``; beyond it the oldest is dropped and counted); one task per stream drains it, reading
each frame's landmarks with ``extract`` on the vision pool (mediapipe's tracking kept per stream) and handing them to
the reader's ``landmarks``. A frame the extractor could not read becomes an error event; the stream goes on.
"""

from __future__ import annotations

import abc
import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BackendError, LinguaFusionError
from ..stream.events import Error, Event
from ..video.frames import FrameStats, VideoFrame
from .landmarks import LandmarkFrame
from .sampler import AdaptiveSampler

if TYPE_CHECKING:
    from ..stream.contracts import Spawn

MAX_QUEUED = 16  # frames waiting for the extractor per stream


class LandmarkLane(abc.ABC):
    """A FrameConsumer that reads landmarks of sampled frames in order; subclasses say what the landmarks mean."""

    what = "landmarks"  # names the task and the error events ("sign", "lip")

    def __init__(self, extract: Callable[[float, np.ndarray], LandmarkFrame], emit: Callable[[Event], None],
                 spawn: Spawn,
                 loop: asyncio.AbstractEventLoop, sampler: AdaptiveSampler, pool: Executor | None) -> None:
        self._extract = extract
        self._pool = pool  # where extraction runs (VisionService.pool); None: the loop's default threads
        self._emit = emit
        self._spawn = spawn
        self._loop = loop
        self.sampler = sampler
        self._lock = threading.Lock()  # the sampler is offered frames on a worker thread
        self._queue: deque[tuple[float, np.ndarray]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._offered = (-1e9, 0.0)  # (media time, wall clock) of the last frame handed to the loop
        self.dropped = 0

    # ---- FrameConsumer (worker thread) -----------------------------------------------------------------------
    def offer(self, frame: VideoFrame) -> None:
        with self._lock:
            wanted = self.sampler.offer(frame.t, frame.rgb)
        if wanted:
            self._loop.call_soon_threadsafe(self._want, frame.t, frame.rgb)

    def stats(self) -> FrameStats:
        return self.sampler.stats()

    # ---- reading (event loop) --------------------------------------------------------------------------------
    @abc.abstractmethod
    async def landmarks(self, lm: LandmarkFrame) -> None:
        """One analysed frame's landmarks, in media-time order (what a sign or lip reader does with them)."""

    @abc.abstractmethod
    async def finish(self, wait_s: float) -> None:
        """The stream ends: what is still being read or decided goes out, within ``wait_s`` seconds."""

    def reading(self) -> bool:
        """Frames queued or being read."""
        return bool(self._queue) or (self._task is not None and not self._task.done())

    async def read_all(self) -> None:
        """Wait until the frames queued now are read (the caller bounds the wait)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.shield(task)

    def _want(self, t: float, rgb: np.ndarray) -> None:
        self._offered = (t, time.monotonic())
        if len(self._queue) >= MAX_QUEUED:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append((t, rgb))
        if self._task is None or self._task.done():
            self._task = self._spawn(self._drain(), self.what)

    async def _drain(self) -> None:
        while self._queue:
            t, rgb = self._queue.popleft()
            try:
                lm = await self._loop.run_in_executor(self._pool, self._extract, t, rgb)
            except (BackendError, LinguaFusionError) as exc:
                self._emit(Error(exc.code, f"{self.what} landmarks not read: {exc.public_message}"))
                continue
            await self.landmarks(lm)
