"""The contracts between gateways about rooms, and their in-process implementations.

``RoomBus`` moves a room's events: ``publish`` (a final is also kept in the room's history, the last
``max_finals``), ``history`` (finals after a seq, in order), ``position`` and ``follow`` (events after a position,
in publish order). ``RoomDirectory`` keeps the rooms' records, their listener-token digests and who listens to
which language (presence entries that expire unless refreshed, so a gateway that dies stops counting).
A room holds at most ``max_tokens`` listener-token digests (``add_token`` returns False past it: the caller
refuses), and they expire ``ttl_s`` after the room's last write (create, save, a new token), on both backends.
A room's record expires ``ttl_s`` after its last create or save, on both backends (in-process, an expired record
reads as absent and the next ``create`` drops every expired record with its presence).

Both are selected like the stream log: Redis (``redis_bus.py``) when ``state.redis_url`` is set, so every gateway
sharing that Redis sees every room; these in-process ones otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .model import Room

MAX_FINALS = 1000  # finals a room keeps for late joiners and reconnecting listeners
MAX_LIVE = 2000  # live events a room's bus keeps for followers that fell behind
MAX_ENDED_ROOMS = 256  # in-process: ended rooms whose history is kept (Redis expires them instead)
CLOSED_SEQ = 2**53  # the room's `closed` event is kept in its history after every final (a late joiner gets it)
MAX_TOKENS = 10_000  # listener tokens a room may have (limits.max_listener_tokens_per_room)
TTL_S = 24 * 3600  # a room's keys (Redis) and in-process tokens expire this long after the room's last write


class RoomBus(Protocol):
    async def publish(self, room_id: str, event: dict[str, Any]) -> None:
        """Send ``event`` (a wire event) to every follower; a final (with ``seq``) is kept in the history too,
        before or atomically with the live send, so a follower that reads history after it started following
        misses nothing."""
        ...

    async def history(self, room_id: str, after_seq: int) -> list[dict[str, Any]]:
        """The kept finals with ``seq > after_seq``, in seq order, each once; then ``closed`` if the room ended."""
        ...

    async def position(self, room_id: str) -> str:
        """Where the live feed is now: ``follow`` from here yields only what is published later."""
        ...

    def follow(self, room_id: str, position: str) -> AsyncIterator[dict[str, Any]]:
        """Every event published after ``position``, in order, until cancelled."""
        ...

    async def close(self) -> None: ...


class RoomDirectory(Protocol):
    max_tokens: int  # listener tokens a room may have

    async def create(self, room: Room, token_digest: str) -> None: ...

    async def get(self, room_id: str) -> Room | None: ...

    async def save(self, room: Room) -> None: ...

    async def touch(self, room: Room) -> None:
        """Push the expiry of the room's record and tokens on, as a save would, without writing the record (a live
        room's publisher does it now and then, so a room live for longer than ``ttl_s`` is not forgotten)."""
        ...

    async def rooms_of(self, owner: str) -> list[Room]: ...

    async def room_of_stream(self, stream_id: str) -> str | None: ...

    async def add_token(self, room_id: str, token_digest: str) -> bool:
        """Add a listener token's digest; False (nothing added) if the room already has ``max_tokens``."""
        ...

    async def token_ok(self, room_id: str, token_digest: str) -> bool: ...

    async def listen(self, room_id: str, gateway: str, counts: dict[str, int], until: float) -> None:
        """This gateway's listeners of the room per language (replacing what it said before), valid until
        ``until`` (wall-clock seconds) unless said again: a gateway that dies stops counting."""
        ...

    async def languages(self, room_id: str, now: float) -> dict[str, int]:
        """Listeners per language whose presence has not expired at ``now``."""
        ...

    async def close(self) -> None: ...


@dataclass
class _Channel:
    finals: dict[int, dict[str, Any]] = field(default_factory=dict)
    live: deque[tuple[int, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=MAX_LIVE))
    counter: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


def _past(ch: _Channel, seen: int) -> bool:
    return ch.counter > seen


class LocalRoomBus:
    """One process: a bounded deque of live events and a dict of finals per room."""

    def __init__(self, max_finals: int = MAX_FINALS) -> None:
        self.max_finals = max_finals
        self._rooms: dict[str, _Channel] = {}
        self._ended: deque[str] = deque()

    def _ch(self, room_id: str) -> _Channel:
        ch = self._rooms.get(room_id)
        if ch is None:
            ch = self._rooms[room_id] = _Channel()
        return ch

    async def publish(self, room_id: str, event: dict[str, Any]) -> None:
        ch = self._ch(room_id)
        kind = event.get("type")
        if kind == "final":
            seq = int(event["seq"])
            ch.finals[seq] = event
            for old in [s for s in ch.finals if s <= seq - self.max_finals]:  # the last max_finals kept
                del ch.finals[old]
        elif kind == "closed":
            ch.finals[CLOSED_SEQ] = event
        ch.counter += 1
        ch.live.append((ch.counter, event))
        if kind == "closed" and room_id not in self._ended:
            self._ended.append(room_id)  # kept for late joiners, the oldest dropped past MAX_ENDED_ROOMS
            while len(self._ended) > MAX_ENDED_ROOMS:
                self._rooms.pop(self._ended.popleft(), None)
        async with ch.changed:
            ch.changed.notify_all()

    async def history(self, room_id: str, after_seq: int) -> list[dict[str, Any]]:
        ch = self._ch(room_id)
        return [ch.finals[s] for s in sorted(ch.finals) if s > after_seq]

    async def position(self, room_id: str) -> str:
        return str(self._ch(room_id).counter)

    async def follow(self, room_id: str, position: str) -> AsyncIterator[dict[str, Any]]:
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

    def drop(self, room_id: str) -> None:
        self._rooms.pop(room_id, None)

    async def close(self) -> None:
        self._rooms.clear()


@dataclass
class _Tokens:
    digests: set[str]
    expires: float  # on ``clock``


@dataclass
class _Record:
    room: Room  # the directory's own copy
    expires: float  # on ``clock``: ttl_s after the record's last create, save or touch


class LocalRoomDirectory:
    def __init__(self, *, max_tokens: int = MAX_TOKENS, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_tokens = max_tokens
        self.ttl_s = ttl_s
        self.clock = clock
        self._rooms: dict[str, _Record] = {}
        self._tokens: dict[str, _Tokens] = {}
        self._presence: dict[str, dict[str, tuple[dict[str, int], float]]] = {}

    def _live_tokens(self, room_id: str) -> _Tokens | None:
        """The room's tokens unless they expired (then they are dropped, as Redis drops an expired key)."""
        tokens = self._tokens.get(room_id)
        if tokens is not None and tokens.expires <= self.clock():
            del self._tokens[room_id]
            return None
        return tokens

    def _live_record(self, room_id: str) -> _Record | None:
        """The room's record unless it expired (then it is dropped with its presence, as Redis drops the key)."""
        record = self._rooms.get(room_id)
        if record is not None and record.expires <= self.clock():
            del self._rooms[room_id]
            self._presence.pop(room_id, None)
            return None
        return record

    def _touch(self, room_id: str) -> None:
        tokens = self._live_tokens(room_id)
        if tokens is not None:
            tokens.expires = self.clock() + self.ttl_s

    async def create(self, room: Room, token_digest: str) -> None:
        now = self.clock()
        for rid in [r for r, t in self._tokens.items() if t.expires <= now]:  # every room's, once per new room
            del self._tokens[rid]
        for rid in list(self._rooms):
            self._live_record(rid)
        self._put(room)
        self._tokens[room.room_id] = _Tokens({token_digest}, now + self.ttl_s)

    def _put(self, room: Room) -> None:
        self._rooms[room.room_id] = _Record(Room.from_dict(room.to_dict()), self.clock() + self.ttl_s)

    def _live_rooms(self) -> list[Room]:
        now = self.clock()
        return [r.room for r in self._rooms.values() if r.expires > now]

    async def get(self, room_id: str) -> Room | None:
        record = self._live_record(room_id)
        return Room.from_dict(record.room.to_dict()) if record is not None else None  # a copy, as Redis would give

    async def save(self, room: Room) -> None:
        self._put(room)
        self._touch(room.room_id)

    async def touch(self, room: Room) -> None:
        record = self._live_record(room.room_id)
        if record is not None:
            record.expires = self.clock() + self.ttl_s
        self._touch(room.room_id)

    async def rooms_of(self, owner: str) -> list[Room]:
        return [Room.from_dict(r.to_dict()) for r in self._live_rooms() if r.owner == owner]

    async def room_of_stream(self, stream_id: str) -> str | None:
        return next((r.room_id for r in self._live_rooms() if r.stream_id == stream_id), None)

    async def add_token(self, room_id: str, token_digest: str) -> bool:
        tokens = self._live_tokens(room_id)
        if tokens is None:
            tokens = self._tokens[room_id] = _Tokens(set(), 0.0)
        if len(tokens.digests) >= self.max_tokens:
            return False
        tokens.digests.add(token_digest)
        tokens.expires = self.clock() + self.ttl_s
        return True

    async def token_ok(self, room_id: str, token_digest: str) -> bool:
        tokens = self._live_tokens(room_id)
        return tokens is not None and token_digest in tokens.digests

    async def listen(self, room_id: str, gateway: str, counts: dict[str, int], until: float) -> None:
        if self._live_record(room_id) is None:
            return  # no live record (expired and dropped): its presence would never be dropped again
        self._presence.setdefault(room_id, {})[gateway] = (dict(counts), until)

    async def languages(self, room_id: str, now: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for counts, until in self._presence.get(room_id, {}).values():
            if until > now:
                for lang, n in counts.items():
                    if n > 0:
                        out[lang] = out.get(lang, 0) + n
        return out

    async def close(self) -> None:
        pass
