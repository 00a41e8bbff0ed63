"""Where the rooms' records, listener tokens and presence are kept: the ``RoomDirectory`` Protocol, its limits, and
its in-process implementation (``redis_bus.py`` has the Redis one).

Every look-up is by index, never a walk over every room: records by room id, each owner's open (waiting, live) and
ended rooms, the room of a publishing stream. Bounds (``RoomLimits``), the same on both backends:

- ``create`` returns False (nothing made) when the owner already has ``max_open_per_key`` open rooms;
- a room ends with ``save`` (state ``ended``): it is kept ``ended_ttl_s`` from then, and ``save`` forgets the
  owner's oldest ended rooms past ``max_ended_per_key`` and returns their ids (the caller drops their history);
- a waiting or live room expires ``ttl_s`` after its last write (create, save, touch, a token added);
- a room holds at most ``max_tokens`` listener tokens (``add_token`` returns False past it), kept with its record.

Expired rooms are dropped as they are met and, in-process, from a heap of expiry times on each create (Redis
expires its keys itself).
"""

from __future__ import annotations

import heapq
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .model import Room, State, TokenInfo, token_id_of_digest


@dataclass(frozen=True)
class RoomLimits:
    max_tokens: int = 10_000  # listener tokens a room may have (limits.max_listener_tokens_per_room)
    max_open_per_key: int = 100  # rooms.max_open_per_key
    max_ended_per_key: int = 20  # rooms.max_ended_per_key
    ttl_s: float = 24 * 3600.0  # rooms.ttl_s
    ended_ttl_s: float = 3600.0  # rooms.ended_ttl_s

    def ttl_for(self, room: Room) -> float:
        return self.ended_ttl_s if room.state == State.ENDED else self.ttl_s


class RoomDirectory(Protocol):
    limits: RoomLimits

    async def create(self, room: Room, token: TokenInfo) -> bool:
        """Keep a new room with its first token; False (nothing kept) if its owner has ``max_open_per_key``."""
        ...

    async def get(self, room_id: str) -> Room | None: ...

    async def save(self, room: Room) -> list[str]:
        """Write the record (an ended room: kept ``ended_ttl_s``); the ids of the owner's ended rooms forgotten to
        keep ``max_ended_per_key`` (the caller drops their history from the bus)."""
        ...

    async def touch(self, room: Room) -> None:
        """Push the expiry of the room's record and tokens on, as a save would, without writing the record (a live
        room's publisher does it now and then, so a room live for longer than ``ttl_s`` is not forgotten)."""
        ...

    async def forget(self, room_id: str, owner: str) -> None:
        """Drop the room: record, tokens, presence, its owner's index entries (deleted, or its key revoked)."""
        ...

    async def rooms_of(self, owner: str) -> list[Room]:
        """The owner's open and ended rooms (at most ``max_open_per_key + max_ended_per_key``)."""
        ...

    async def room_of_stream(self, stream_id: str) -> str | None: ...

    async def add_token(self, room_id: str, token: TokenInfo) -> bool:
        """Add a listener token; False (nothing added) if the room already has ``max_tokens`` or is gone."""
        ...

    async def token_ok(self, room_id: str, token_digest: str) -> bool: ...

    async def tokens(self, room_id: str) -> list[TokenInfo]:
        """The room's listener tokens, oldest first."""
        ...

    async def remove_token(self, room_id: str, token_id: str) -> bool:
        """Revoke one token; False if the room has no such token."""
        ...

    async def listen(self, room_id: str, gateway: str, counts: dict[str, int], until: float) -> None:
        """This gateway's listeners of the room per language (replacing what it said before), valid until
        ``until`` (wall-clock seconds) unless said again: a gateway that dies stops counting."""
        ...

    async def languages(self, room_id: str, now: float) -> dict[str, int]:
        """Listeners per language whose presence has not expired at ``now``."""
        ...

    async def close(self) -> None: ...


@dataclass
class _Record:
    room: Room  # the directory's own copy
    expires: float  # on ``clock``
    tokens: dict[str, TokenInfo] = field(default_factory=dict)  # by token id


class LocalRoomDirectory:
    def __init__(self, limits: RoomLimits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or RoomLimits()
        self.clock = clock
        self._rooms: dict[str, _Record] = {}
        self._open: dict[str, dict[str, None]] = {}  # owner -> its waiting and live rooms
        self._ended: dict[str, OrderedDict[str, None]] = {}  # owner -> its ended rooms, the oldest ended first
        self._by_stream: dict[str, str] = {}
        self._presence: dict[str, dict[str, tuple[dict[str, int], float]]] = {}
        self._expiry: list[tuple[float, str]] = []  # heap: one entry per record, at (or before) its expiry

    # ---- bookkeeping ----------------------------------------------------------------------------------------------
    def _drop(self, room_id: str) -> None:
        record = self._rooms.pop(room_id, None)
        self._presence.pop(room_id, None)
        if record is None:
            return
        owner = record.room.owner
        for index in (self._open, self._ended):
            mine = index.get(owner)
            if mine is not None:
                mine.pop(room_id, None)
                if not mine:
                    del index[owner]
        sid = record.room.stream_id
        if sid is not None and self._by_stream.get(sid) == room_id:
            del self._by_stream[sid]

    def _live(self, room_id: str) -> _Record | None:
        """The room's record unless it expired (then it is dropped, as Redis drops an expired key)."""
        record = self._rooms.get(room_id)
        if record is not None and record.expires <= self.clock():
            self._drop(room_id)
            return None
        return record

    def _sweep(self) -> None:
        """Drop the records whose expiry passed; one whose expiry was pushed on goes back in the heap at it."""
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, room_id = heapq.heappop(self._expiry)
            record = self._rooms.get(room_id)
            if record is None:
                continue
            if record.expires <= now:
                self._drop(room_id)
            else:
                heapq.heappush(self._expiry, (record.expires, room_id))

    def _push(self, record: _Record, *, new: bool = False, before: float = float("inf")) -> None:
        """Set the record's expiry; a new record, or one whose expiry came earlier (it ended), gets a heap entry."""
        record.expires = self.clock() + self.limits.ttl_for(record.room)
        if new or record.expires < before:
            heapq.heappush(self._expiry, (record.expires, record.room.room_id))

    def _index(self, room: Room) -> list[str]:
        """File the room under its owner as open or ended; forget the oldest ended ones past the cap."""
        if room.stream_id:
            self._by_stream[room.stream_id] = room.room_id
        ended = room.state == State.ENDED
        leaving = self._open if ended else self._ended
        mine = leaving.get(room.owner)
        if mine is not None:
            mine.pop(room.room_id, None)
            if not mine:
                del leaving[room.owner]
        if not ended:
            self._open.setdefault(room.owner, {})[room.room_id] = None
            return []
        done = self._ended.setdefault(room.owner, OrderedDict())
        done[room.room_id] = None  # an ended room saved again keeps its place
        gone = []
        while len(done) > self.limits.max_ended_per_key:
            oldest = next(iter(done))
            self._drop(oldest)  # removes it from ``done`` (and ``done`` from the index when it empties)
            gone.append(oldest)
        return gone

    # ---- the Protocol ---------------------------------------------------------------------------------------------
    async def create(self, room: Room, token: TokenInfo) -> bool:
        self._sweep()
        if len(self._open.get(room.owner, ())) >= self.limits.max_open_per_key:
            return False
        record = self._rooms[room.room_id] = _Record(Room.from_dict(room.to_dict()), 0.0, {token.token_id: token})
        self._push(record, new=True)
        self._index(record.room)
        return True

    async def get(self, room_id: str) -> Room | None:
        record = self._live(room_id)
        return Room.from_dict(record.room.to_dict()) if record is not None else None  # a copy, as Redis would give

    async def save(self, room: Room) -> list[str]:
        old = self._live(room.room_id)
        record = self._rooms[room.room_id] = _Record(Room.from_dict(room.to_dict()), 0.0,
                                                     old.tokens if old is not None else {})
        self._push(record, new=old is None, before=old.expires if old is not None else float("inf"))
        return self._index(record.room)

    async def touch(self, room: Room) -> None:
        record = self._live(room.room_id)
        if record is not None:
            self._push(record)

    async def forget(self, room_id: str, owner: str) -> None:
        self._drop(room_id)

    async def rooms_of(self, owner: str) -> list[Room]:
        ids = [*self._open.get(owner, ()), *self._ended.get(owner, ())]
        records = [self._live(i) for i in ids]
        return [Room.from_dict(r.room.to_dict()) for r in records if r is not None]

    async def room_of_stream(self, stream_id: str) -> str | None:
        room_id = self._by_stream.get(stream_id)
        return room_id if room_id is not None and self._live(room_id) is not None else None

    async def add_token(self, room_id: str, token: TokenInfo) -> bool:
        record = self._live(room_id)
        if record is None or (token.token_id not in record.tokens and len(record.tokens) >= self.limits.max_tokens):
            return False
        record.tokens[token.token_id] = token
        self._push(record)
        return True

    async def token_ok(self, room_id: str, token_digest: str) -> bool:
        record = self._live(room_id)
        info = record.tokens.get(token_id_of_digest(token_digest)) if record is not None else None
        return info is not None and hmac.compare_digest(info.digest, token_digest)

    async def tokens(self, room_id: str) -> list[TokenInfo]:
        record = self._live(room_id)
        return sorted(record.tokens.values(), key=lambda t: t.created) if record is not None else []

    async def remove_token(self, room_id: str, token_id: str) -> bool:
        record = self._live(room_id)
        return record is not None and record.tokens.pop(token_id, None) is not None

    async def listen(self, room_id: str, gateway: str, counts: dict[str, int], until: float) -> None:
        if self._live(room_id) is None:
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
