"""How a room's events move between gateways: the ``RoomBus`` Protocol and its in-process implementation.

``RoomBus`` moves a room's events: ``publish`` (a final is also kept in the room's history, the last
``max_finals``), ``history`` (finals after a seq, in order), ``position`` and ``follow`` (events after a position,
in publish order), ``forget`` (a deleted or evicted room's history goes). An ended room's history is kept
``ended_ttl_s`` (and in-process at most ``MAX_ENDED_ROOMS`` of them); the directory (``directory.py``) decides when
a room is forgotten before that.

Selected like the stream log: Redis (``redis_bus.py``) when ``state.redis_url`` is set, so every gateway sharing
that Redis sees every room; this in-process one otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

MAX_FINALS = 1000  # finals a room keeps for late joiners and reconnecting listeners
MAX_LIVE = 2000  # live events a room's bus keeps for followers that fell behind
MAX_ENDED_ROOMS = 256  # in-process: ended rooms whose history is kept (Redis expires them instead)
CLOSED_SEQ = 2**53  # the room's `closed` event is kept in its history after every final (a late joiner gets it)
# the room's latest `speaker_renamed` (it carries every name given) is kept in its history too, and read first
NAMES_SEQ = CLOSED_SEQ - 1
KEPT = {"final", "speaker_renamed", "closed"}  # the events a room's history keeps
ENDED_TTL_S = 3600.0  # an ended room's history is kept this long (rooms.ended_ttl_s)
TTL_S = 24 * 3600.0  # a room's keys expire this long after the room's last write (rooms.ttl_s)
# an event on a room's bus: a stream's wire event (stream/events.py) stamped with published_at, or the room's own
# (model.AccessChange). Read back from Redis too: its values are checked where they are read
RoomEvent: TypeAlias = Mapping[str, object]


class RoomBus(Protocol):
    async def publish(self, room_id: str, event: RoomEvent) -> None:
        """Send ``event`` (a wire event) to every follower; a final (with ``seq``) is kept in the history too,
        before or atomically with the live send, so a follower that reads history after it started following
        misses nothing; so are the latest ``speaker_renamed`` and ``closed``."""
        ...

    async def history(self, room_id: str, after_seq: int) -> list[RoomEvent]:
        """The latest ``speaker_renamed`` (the current names, whatever ``after_seq``), then the kept finals with
        ``seq > after_seq``, in seq order, each once; then ``closed`` if the room ended."""
        ...

    async def position(self, room_id: str) -> str:
        """Where the live feed is now: ``follow`` from here yields only what is published later."""
        ...

    def follow(self, room_id: str, position: str) -> AsyncIterator[RoomEvent]:
        """Every event published after ``position``, in order, until cancelled."""
        ...

    async def forget(self, room_id: str) -> None:
        """Drop the room's history now (followers still get what was published before)."""
        ...

    async def close(self) -> None: ...


def seq_of(event: RoomEvent) -> int:
    """A final's ``seq`` (as ``int()`` reads it: a bus event is JSON that this server wrote)."""
    seq = event["seq"]
    if not isinstance(seq, int | float | str):
        raise TypeError(f"a room event's seq is {type(seq).__name__}")
    return int(seq)


def kept_seq(event: RoomEvent) -> int:
    """Where a kept event sits in a room's history: a final at its seq, the names and ``closed`` past them all."""
    kind = event.get("type")
    return seq_of(event) if kind == "final" else NAMES_SEQ if kind == "speaker_renamed" else CLOSED_SEQ


def names_first(history: Sequence[RoomEvent]) -> list[RoomEvent]:
    """A history (in seq order) with its ``speaker_renamed`` moved to the front: a late listener knows the names
    before the finals that use the labels."""
    return [e for e in history if e.get("type") == "speaker_renamed"] + [
        e for e in history if e.get("type") != "speaker_renamed"]


@dataclass
class _Channel:
    finals: dict[int, RoomEvent] = field(default_factory=dict)
    live: deque[tuple[int, RoomEvent]] = field(default_factory=lambda: deque(maxlen=MAX_LIVE))
    counter: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


def _past(ch: _Channel, seen: int) -> bool:
    return ch.counter > seen


class LocalRoomBus:
    """One process: a bounded deque of live events and a dict of finals per room."""

    def __init__(self, max_finals: int = MAX_FINALS, *, ended_ttl_s: float = ENDED_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_finals = max_finals
        self.ended_ttl_s = ended_ttl_s
        self.clock = clock
        self._rooms: dict[str, _Channel] = {}
        self._ended: OrderedDict[str, float] = OrderedDict()  # room id -> when it ended, the oldest first

    def _ch(self, room_id: str) -> _Channel:
        ch = self._rooms.get(room_id)
        if ch is None:
            ch = self._rooms[room_id] = _Channel()
        return ch

    async def publish(self, room_id: str, event: RoomEvent) -> None:
        ch = self._ch(room_id)
        kind = event.get("type")
        if kind == "final":
            seq = seq_of(event)
            ch.finals[seq] = event
            for old in [s for s in ch.finals if s <= seq - self.max_finals]:  # the last max_finals kept
                del ch.finals[old]
        elif kind in KEPT:
            ch.finals[kept_seq(event)] = event
        ch.counter += 1
        ch.live.append((ch.counter, event))
        if kind == "closed" and room_id not in self._ended:
            self._ended[room_id] = self.clock()  # kept for late joiners: ended_ttl_s, at most MAX_ENDED_ROOMS
            self._drop_ended()
        async with ch.changed:
            ch.changed.notify_all()

    async def history(self, room_id: str, after_seq: int) -> list[RoomEvent]:
        ch = self._rooms.get(room_id)  # not made here: a history read keeps nothing
        if ch is None:
            return []
        return names_first([ch.finals[s] for s in sorted(ch.finals) if s > after_seq])

    async def position(self, room_id: str) -> str:
        return str(self._ch(room_id).counter)

    async def follow(self, room_id: str, position: str) -> AsyncIterator[RoomEvent]:
        ch = self._ch(room_id)
        seen = int(position)
        while True:
            async with ch.changed:
                await ch.changed.wait_for(functools.partial(_past, ch, seen))
            fresh = min(ch.counter - seen, len(ch.live))  # the newest ones only (a deque reads fast from its end)
            batch = [ch.live[-i] for i in range(fresh, 0, -1)]
            seen = ch.counter
            for _n, event in batch:
                yield event

    def _drop_ended(self) -> None:
        too_old = self.clock() - self.ended_ttl_s
        while self._ended and (len(self._ended) > MAX_ENDED_ROOMS or next(iter(self._ended.values())) <= too_old):
            self._rooms.pop(self._ended.popitem(last=False)[0], None)

    async def forget(self, room_id: str) -> None:
        self._rooms.pop(room_id, None)  # a follower keeps its channel until it stops
        self._ended.pop(room_id, None)

    async def close(self) -> None:
        self._rooms.clear()
