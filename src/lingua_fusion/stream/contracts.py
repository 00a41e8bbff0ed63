"""What a StreamSession hands its parts (stream/ingest.py, images.py, finals.py, its Outbox): the
event sink, the task owner, the breaker's question, and ``Slots``, a bound shared by the streams of a service; and
``Vocabularies``, the face of a stream's taught signs and lips (vision/), which the app injects so that stream/
never imports vision/."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Protocol, TypeVar

from .events import Event, Final

if TYPE_CHECKING:
    from .jobs import StreamJobs
    from .protocol import StreamSpec

T = TypeVar("T")
Emit = Callable[[Event], None]  # an event for the client (the session's outbox; never blocks)
Degraded = Callable[[str], bool]  # is the breaker's step active for this stream's SLO class now?
Alive = Callable[[], bool]  # the session's state allows this work (live, or not yet closed: the caller says which)
Queue = Callable[[Coroutine[object, object, "Final | None"]], None]  # a caption job into the session's ordered finals
Heard = Callable[[], tuple[float, float | None, bool]]  # audio heard so far: until (s), open speech's start, in speech


class Spawn(Protocol):
    """A task the session owns and cancels: ``coro`` run as a task named ``name``."""

    def __call__(self, coro: Coroutine[object, object, T], name: str, /) -> asyncio.Task[T]: ...


class Vocabularies(Protocol):
    """A key's taught vocabularies, as a live stream reads them (vision/stream_signs.py ``StreamVocabularies``).
    ``video`` is the session's video fan-out (stream/video.py ``StreamVideo``), opaque here: video/ imports
    stream/, not the other way."""

    def check(self, key_id: str, vocabulary_id: str) -> None:
        """Raise (404 / 400) unless ``key_id`` has taught ``vocabulary_id``; blocking briefly (the store)."""
        ...

    async def attach(self, video: object, spec: StreamSpec, jobs: StreamJobs, emit: Emit, spawn: Spawn, *,
                     queue: Queue, heard: Heard) -> None:
        """Read signs (or lips fused with speech) from the stream's video frames against its vocabulary."""
        ...

    async def finish(self, video: object, wait_s: float) -> None:
        """The stream ends: a sign still being made goes out (within ``wait_s``)."""
        ...


class Slots:
    """A count of things in flight with a bound, shared by the streams of a service (decoded images: a key's 32
    streams must not hold 64 decoded 40-megapixel frames at once), and a share per key: one key holds at most
    half of them (rounded up), so another key's picture always finds a slot that the first key cannot take."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_key = max(1, (limit + 1) // 2)
        self.used = 0
        self.held: dict[str, int] = {}

    def take(self, key: str = "") -> bool:
        if self.used >= self.limit or self.held.get(key, 0) >= self.per_key:
            return False
        self.used += 1
        self.held[key] = self.held.get(key, 0) + 1
        return True

    def give(self, key: str = "") -> None:
        self.used = max(0, self.used - 1)
        left = self.held.get(key, 0) - 1
        if left > 0:
            self.held[key] = left
        else:
            self.held.pop(key, None)
