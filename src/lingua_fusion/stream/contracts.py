"""What a StreamSession hands its parts (stream/ingest.py, decisions.py, images.py, finals.py, outbox.py): the
event sink, the task owner, the breaker's question, and ``Slots``, a bound shared by the streams of a service."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .events import Event

Emit = Callable[[Event], None]  # an event for the client (the session's outbox; never blocks)
Spawn = Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]]  # a task the session owns and cancels
Degraded = Callable[[str], bool]  # is the breaker's step active for this stream's SLO class now?
Alive = Callable[[], bool]  # the session's state allows this work (live, or not yet closed: the caller says which)


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
