"""One decoded frame sequence -> every frame consumer attached to it, each at its own rate.

A file (or a stream) builds one ``FrameFanout`` and attaches its consumers: the slide reader at 2 fps, a landmark
extractor at whatever rate it asks. The decoder samples at the fastest rate any consumer wants (``fanout.fps``);
each consumer is offered only the frames that fall on its own ticks. A consumer registered in ``FILE_CONSUMERS``
is attached to every video file's fanout without touching the file path (``STREAM_CONSUMERS``: to every stream
that sends ``frame`` messages, the factory given the StreamSession):

    from lingua_fusion.video.fanout import FILE_CONSUMERS, Tap
    FILE_CONSUMERS["landmarks"] = lambda ctx: Tap("landmarks", MyExtractor(ctx), fps=10)  # or None: not this file

``ctx`` is a ``FrameContext`` (the request's languages, settings and model registry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .frames import FrameConsumer, FrameStats, VideoFrame

if TYPE_CHECKING:
    from ..config import Settings
    from ..models.registry import Registry


@dataclass
class Tap:
    name: str
    consumer: FrameConsumer
    fps: float  # the most frames per second of media time this consumer wants
    _next: float = field(default=0.0, repr=False)

    def due(self, t: float) -> bool:
        if t + 1e-6 < self._next:
            return False
        self._next = (math.floor(max(0.0, t) * self.fps + 1e-6) + 1) / self.fps
        return True


@dataclass(frozen=True)
class FrameContext:
    """What a consumer factory may look at to build its consumer for one file."""

    source_lang: str | None
    target_lang: str
    settings: Settings
    registry: Registry
    # vision/file_signs.py SignReader (vision/ imports this module): the request named a sign vocabulary
    signs: FrameConsumer | None = None


FILE_CONSUMERS: dict[str, Callable[[FrameContext], Tap | None]] = {}
# the same for live streams' ``frame`` messages: factory(session) -> Tap or None (stream/video.py StreamVideo)
STREAM_CONSUMERS: dict[str, Callable[[object], Tap | None]] = {}  # the session: stream/ is not imported here


class FrameFanout:
    def __init__(self, taps: list[Tap] | None = None) -> None:
        self.taps: list[Tap] = []
        for tap in taps or []:
            self.attach(tap)

    def attach(self, tap: Tap) -> None:
        if not 0 < tap.fps <= 60:
            raise ValueError(f"{tap.name}: fps must be in (0, 60]")
        if any(t.name == tap.name for t in self.taps):
            raise ValueError(f"a consumer named {tap.name} is already attached")
        self.taps.append(tap)

    def get(self, name: str) -> FrameConsumer | None:
        return next((t.consumer for t in self.taps if t.name == name), None)

    @property
    def fps(self) -> float:
        """The rate the decoder must sample at: the fastest any consumer wants (0: nothing to decode)."""
        return max((t.fps for t in self.taps), default=0.0)

    def offer(self, frame: VideoFrame) -> None:
        for tap in self.taps:
            if tap.due(frame.t):
                tap.consumer.offer(frame)

    def stats(self) -> dict[str, FrameStats]:
        return {t.name: t.consumer.stats() for t in self.taps}


def file_fanout(ctx: FrameContext, own: list[Tap]) -> FrameFanout:
    """``own`` taps (the file path's slide reader) plus every registered consumer that wants this file."""
    fanout = FrameFanout(own)
    for name, factory in FILE_CONSUMERS.items():
        tap = factory(ctx)
        if tap is not None:
            tap.name = tap.name or name
            fanout.attach(tap)
    return fanout
