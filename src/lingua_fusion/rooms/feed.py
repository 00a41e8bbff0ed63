"""One gateway's side of a room: a ``Feed`` follows the room on the bus once and hands each event to the room's
local ``Listener``s, each through a bounded queue.

A listener that falls behind never slows the room: when its queue is full a partial for it is dropped (counted)
and a final closes it with ``slow_consumer`` (it reconnects with ``after_seq`` and gets what it missed from the
history). What a listener of given languages is sent is computed and JSON-encoded once per event and language set,
however many listen. An ``access`` event (``model.AccessChange``) is the room's own: never sent, it closes the
listeners it refuses (a revoked token or owner key: ``unauthenticated``, 4401; a language the room no longer allows:
``target_not_allowed``, 4403).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from ..errors import AuthenticationError, LinguaFusionError, SlowConsumer, TargetNotAllowed
from .bus import RoomBus, RoomEvent, seq_of
from .model import ACCESS, AccessChange, project

log = logging.getLogger("lingua_fusion.rooms")
LISTENER_QUEUE = 256
STOP_S = 2.0
_ids = itertools.count(1)


@dataclass(frozen=True)
class Outgoing:
    """One event for a listener: the dict (seq, type) and its JSON, encoded once for every listener alike."""

    event: RoomEvent
    text: str

    @property
    def type(self) -> str:
        return str(self.event.get("type"))

    @property
    def seq(self) -> int | None:
        s = self.event.get("seq")
        return seq_of(self.event) if self.type == "final" and s is not None else None


@dataclass(eq=False)
class Listener:
    room_id: str
    langs: tuple[str, ...]
    speech: bool = False
    after_seq: int = 0
    max_queue: int = LISTENER_QUEUE
    token_id: str = ""  # the listener token it joined with (model.token_id_of)
    listener_id: str = field(default_factory=lambda: f"ls_{next(_ids)}")
    partials_dropped: int = 0
    error: LinguaFusionError | None = None

    def __post_init__(self) -> None:
        self._queue: asyncio.Queue[Outgoing | None] = asyncio.Queue(maxsize=self.max_queue)
        self._history: list[Outgoing] = []
        self._through = self.after_seq  # the last final seq this listener has been given
        self.closed = False

    def offer(self, out: Outgoing) -> None:
        """From the feed (never blocks): queue it, or drop a partial, or close a listener too far behind."""
        if self.closed:
            return
        try:
            self._queue.put_nowait(out)
        except asyncio.QueueFull:
            if out.type in ("partial", "revision"):
                self.partials_dropped += 1
                return
            self.close(SlowConsumer(f"this listener fell {self.max_queue} events behind the room; reconnect with "
                                    f"after_seq={self._through} to get the finals it missed"))

    def prime(self, history: list[Outgoing]) -> None:
        """The finals it missed, read after it joined the feed (so nothing falls between history and live)."""
        self._history = history

    def close(self, error: LinguaFusionError | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = error
        with contextlib.suppress(asyncio.QueueEmpty):  # room for the end marker: the queue may be full
            while self._queue.full():
                self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def outgoing(self) -> AsyncIterator[Outgoing]:
        """History first, then the live feed; every final exactly once, in seq order (a final already given
        by the history is skipped when the live feed brings it too). Ends after ``closed`` or when closed."""
        for out in self._history:
            if out.type == "closed":
                yield out
                return
            if out.seq is None:  # a notice (log_compacted)
                yield out
            elif out.seq > self._through:
                self._through = out.seq
                yield out
        self._history = []
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if item.seq is not None:
                if item.seq <= self._through:
                    continue
                self._through = item.seq
            yield item
            if item.type == "closed":
                return


class Encoder:
    """Projection + JSON per (event, language set, speech), cached for the event being fanned out."""

    def __init__(self, event: RoomEvent) -> None:
        self.event = event
        self._done: dict[tuple[tuple[str, ...], bool], Outgoing | None] = {}

    def for_listener(self, langs: tuple[str, ...], speech: bool) -> Outgoing | None:
        k = (langs, speech)
        if k not in self._done:
            p = project(self.event, langs, speech)
            self._done[k] = Outgoing(p, _json(p)) if p is not None else None
        return self._done[k]


class Feed:
    """A room followed on the bus by this gateway, for its local listeners."""

    def __init__(self, room_id: str, bus: RoomBus, on_empty: Callable[[Feed], None], owner: str = "") -> None:
        self.room_id = room_id
        self.owner = owner  # the room's owner key: its revocation closes these listeners (api/revocation.py)
        self.bus = bus
        self.listeners: set[Listener] = set()
        self._on_empty = on_empty
        self._task: asyncio.Task[None] | None = None
        self.ended = False

    async def start(self) -> None:
        position = await self.bus.position(self.room_id)
        self._task = asyncio.create_task(self._run(position), name=f"room-feed:{self.room_id}")

    async def _run(self, position: str) -> None:
        try:
            async for event in self.bus.follow(self.room_id, position):
                if event.get("type") == ACCESS:
                    self.apply(AccessChange.from_wire(event))
                    continue
                self.fan_out(event)
                if event.get("type") == "closed":
                    break
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the listeners are told, not left hanging
            log.exception("room %s: feed failed", self.room_id)
        self.ended = True
        for listener in list(self.listeners):
            listener.close()
        self.listeners.clear()
        self._on_empty(self)

    def fan_out(self, event: RoomEvent) -> None:
        enc = Encoder(event)
        for listener in list(self.listeners):
            out = enc.for_listener(listener.langs, listener.speech)
            if out is not None:
                listener.offer(out)
                if listener.closed:
                    self.remove(listener)

    def apply(self, change: AccessChange) -> int:
        """Close the listeners ``change`` refuses, each told why; how many."""
        closed = 0
        for listener in list(self.listeners):
            why = change.refuses(listener.token_id, listener.langs)
            if why is None:
                continue
            listener.close(refusal(why, change))
            self.remove(listener)
            closed += 1
        return closed

    def add(self, listener: Listener) -> None:
        self.listeners.add(listener)

    def remove(self, listener: Listener) -> None:
        self.listeners.discard(listener)
        if not self.listeners and not self.ended:
            self._on_empty(self)

    def cancel(self) -> None:
        """Stop following (no listener left here); safe from inside the feed's own task."""
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    async def stop(self) -> None:
        """Cancel the follower and wait for it, ``STOP_S`` at most: a Redis client cancelled while it connects
        has been seen never to finish (the room service's close, hence a server's shutdown, waited forever)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=STOP_S)


def refusal(why: str, change: AccessChange) -> LinguaFusionError:
    if why == "language":
        allowed = sorted(change.allowed or ())
        return TargetNotAllowed(f"this room's publisher allows listeners the languages {', '.join(allowed)} only",
                                details={"allowed": allowed})
    if change.everyone:
        return AuthenticationError("the room's owner key was revoked: its listener tokens no longer open it")
    return AuthenticationError("this listener token was revoked by the room's owner")


def encode_history(events: Sequence[RoomEvent], langs: tuple[str, ...]) -> list[Outgoing]:
    out = []
    for e in events:
        p = project(e, langs)
        if p is not None:
            out.append(Outgoing(p, _json(p)))
    return out


def _json(event: RoomEvent) -> str:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))
