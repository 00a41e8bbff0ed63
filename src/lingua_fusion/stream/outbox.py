"""A session's way out: one bounded event queue, a tap that sees every event first, and ``outgoing``, what the
client is sent. A client that stops reading fills the queue: the owner is told (``full``) and closes the stream
with a clear error instead of buffering without bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from ..errors import LinguaFusionError
from .events import Event, error_event


class Outbox:
    def __init__(self, max_events: int, full: Callable[[], None]) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue(maxsize=max_events)
        self._full = full
        # sees every event the session emits, first (a room's publisher: rooms/publisher.py); must never block
        self.tap: Callable[[Event], None] | None = None

    def emit(self, event: Event) -> None:
        if self.tap is not None:
            self.tap(event)
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self._full()

    async def outgoing(self, closed: asyncio.Event,
                       error: Callable[[], LinguaFusionError | None]) -> AsyncIterator[Event]:
        """Every queued event through ``closed``; a stream that ended without one (``closed`` set: slow consumer,
        shed, drain) gives what was queued, then the ``error()`` saying why."""
        while True:
            get = asyncio.ensure_future(self.events.get())
            was_closed = asyncio.ensure_future(closed.wait())
            try:
                done, _ = await asyncio.wait({get, was_closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the reader is cancelled (its client left): neither waiter is left pending
                for waiter in (get, was_closed):
                    if not waiter.done():
                        waiter.cancel()
            if get in done:
                event = get.result()
                yield event
                if event.TYPE == "closed":
                    return
                continue
            while not self.events.empty():
                yield self.events.get_nowait()
            why = error()
            if why is not None:
                yield error_event(why)
            return
