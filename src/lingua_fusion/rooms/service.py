"""``RoomService``: rooms on one gateway: create, mint, list and revoke listener tokens, list, delete (owner key
only), publish a stream into a room, and join a room as a listener.

A listener token opens its room only while the token is not revoked, its room not deleted and its owner's key not
revoked (``owner_revoked``, asked at each join; a revocation also closes the open listeners on every gateway: an
``AccessChange`` on the room's bus, ``feed.py``), and only in the languages the room allows (``model.listenable``).

A listener joins in three steps, in this order, so that no final falls between history and live: it is added to
this gateway's ``Feed`` of the room (which follows the bus from a position taken before), then the history after
its ``after_seq`` is read, then it is given that history followed by the live events (finals the history already
gave are skipped by seq). Presence (who listens to which language) is written per gateway and refreshed every
``PRESENCE_S``; the publisher's gateway reads it to choose the stream's targets.
"""

from __future__ import annotations

import asyncio
import builtins  # the class below has a method named list: its annotations say builtins.list
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

from .. import langs as langs_mod
from ..errors import (
    AuthenticationError,
    Draining,
    InvalidParameter,
    LinguaFusionError,
    NotConfigured,
    NotFound,
    QuotaExceeded,
    TargetNotAllowed,
)
from ..stream.events import Ready
from ..stream.session import StreamSession
from .bus import LocalRoomBus, RoomBus, seq_of
from .directory import LocalRoomDirectory, RoomDirectory, RoomLimits
from .feed import Feed, Listener, encode_history
from .history import gap_notice, with_closed
from .metrics import RoomMetrics
from .model import (
    MAX_ALLOWED_TARGETS,
    MAX_LABEL,
    MAX_LISTEN_LANGS,
    ROOM_ID,
    TOKEN_ID,
    AccessChange,
    Room,
    State,
    TokenInfo,
    TokenJSON,
    digest,
    listenable,
    new_room_id,
    new_token,
    token_id_of_digest,
)
from .publisher import SPEECH, RoomPublisher

log = logging.getLogger("lingua_fusion.rooms")
PRESENCE_S = 2.0  # how often a gateway says again who listens to what
PRESENCE_TTL_S = 10.0  # a gateway silent this long (dead) stops counting


def open_rooms(redis_url: str | None, limits: RoomLimits | None = None) -> tuple[RoomBus, RoomDirectory]:
    """Redis when the server keeps its state there (every gateway sees every room), else in-process."""
    limits = limits or RoomLimits()
    if redis_url:
        from .redis_bus import RedisRoomBus, RedisRoomDirectory

        return (RedisRoomBus(redis_url, ttl_s=limits.ttl_s, ended_ttl_s=limits.ended_ttl_s),
                RedisRoomDirectory(redis_url, limits))
    return LocalRoomBus(ended_ttl_s=limits.ended_ttl_s), LocalRoomDirectory(limits)


async def _never_revoked(_key_id: str) -> bool:
    return False


DRAIN_S = 2.0  # at shutdown, for the listeners' connections to take their last events and the draining one
DRAIN_POLL_S = 0.02


class RoomService:
    def __init__(self, bus: RoomBus, directory: RoomDirectory, *, check_pair: Callable[[str, str], object],
                 low_confidence: Callable[[str, str], bool], metrics: RoomMetrics | None = None,
                 clock: Callable[[], float] = time.time,
                 owner_revoked: Callable[[str], Awaitable[bool]] = _never_revoked) -> None:
        self.bus = bus
        self.owner_revoked = owner_revoked  # the key store's answer (api/app.py): a revoked owner's tokens are dead
        self.directory = directory
        self.unavailable: str | None = None  # why this server makes no rooms (set by serve --workers without Redis)
        self.check_pair = check_pair  # (source, target) -> route; raises unsupported_pair
        self.low_confidence = low_confidence
        self.metrics = metrics or RoomMetrics()
        self.clock = clock
        self.gateway = "gw_" + secrets.token_hex(6)
        self.publishers: dict[str, RoomPublisher] = {}
        self.feeds: dict[str, Feed] = {}
        self._feed_lock = asyncio.Lock()
        self._presence: asyncio.Task[None] | None = None

    # ---- owner routes ------------------------------------------------------------------------------------------
    def _check_available(self) -> None:
        if self.unavailable is not None:
            raise NotConfigured(self.unavailable)

    async def create(self, owner: str, source_lang: str | None = None,
                     allowed_targets: Sequence[object] | None = None) -> tuple[Room, str]:
        self._check_available()
        source = langs_mod.normalize(source_lang, field="source_lang") if source_lang else None
        room = Room(new_room_id(), owner, round(self.clock(), 3), source_lang=source,
                    allowed_targets=self._allowed(source, allowed_targets))
        token = new_token()
        if not await self.directory.create(room, TokenInfo.of(token, room.created)):
            limit = self.directory.limits.max_open_per_key
            raise QuotaExceeded(f"this key has {limit} rooms open; end one first (DELETE /v1/rooms/{{id}})",
                                details={"limit": "max_rooms_per_key", "max": limit})
        return room, token

    def _allowed(self, source: str | None, targets: Sequence[object] | None) -> builtins.list[str] | None:
        """``allowed_targets`` as given: each a language the source can be translated into, at most 32."""
        if targets is None:
            return None
        if not isinstance(targets, list) or len(targets) > MAX_ALLOWED_TARGETS:
            raise InvalidParameter(f"allowed_targets lists at most {MAX_ALLOWED_TARGETS} languages")
        out: builtins.list[str] = []
        for t in targets:
            lang = langs_mod.normalize(t if isinstance(t, str) else "", field="allowed_targets")
            if source and lang != source:
                self.check_pair(source, lang)
            if lang not in out:
                out.append(lang)
        return out

    async def owned(self, room_id: str, owner: str) -> Room:
        """The room if ``owner`` made it; another key's room is a 404, as one that does not exist."""
        room = await self.directory.get(room_id) if ROOM_ID.match(room_id) else None
        if room is None or room.owner != owner:
            raise NotFound(f"no room {room_id[:40]} for this key")
        return room

    async def mint(self, room_id: str, owner: str, label: object = None) -> str:
        room = await self.owned(room_id, owner)
        if room.state == State.ENDED:
            raise InvalidParameter(f"room {room_id} has ended: it takes no new listener tokens")
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
            raise InvalidParameter(f"label is a string of at most {MAX_LABEL} characters")
        return await self._new_token(room.room_id, label)

    async def _new_token(self, room_id: str, label: str | None = None) -> str:
        token = new_token()
        if not await self.directory.add_token(room_id, TokenInfo.of(token, round(self.clock(), 3), label)):
            limit = self.directory.limits.max_tokens
            raise QuotaExceeded(f"room {room_id} has {limit} listener tokens, the most it may have; revoke some "
                                "(DELETE /v1/rooms/{id}/tokens/{token_id}), or create another room",
                                details={"limit": "max_listener_tokens_per_room", "max": limit})
        return token

    async def tokens(self, room_id: str, owner: str) -> builtins.list[TokenJSON]:
        room = await self.owned(room_id, owner)
        return [t.public() for t in await self.directory.tokens(room.room_id)]

    async def revoke_token(self, room_id: str, owner: str, token_id: str) -> int:
        """The token opens nothing any more; its open listeners are closed (``unauthenticated``, 4401) here at
        once and on other gateways as their feed reads the change. How many were closed here."""
        room = await self.owned(room_id, owner)
        if not TOKEN_ID.match(token_id) or not await self.directory.remove_token(room.room_id, token_id):
            raise NotFound(f"room {room.room_id} has no listener token {token_id[:40]}")
        return await self._refuse(room.room_id, AccessChange("token_revoked", revoked=(token_id,)))

    async def _refuse(self, room_id: str, change: AccessChange) -> int:
        feed = self.feeds.get(room_id)
        closed = feed.apply(change) if feed is not None else 0
        await self.bus.publish(room_id, change.to_wire())  # the other gateways' feeds
        self.metrics.listeners.set(sum(len(f.listeners) for f in self.feeds.values()))
        return closed

    async def describe(self, room: Room) -> dict[str, object]:
        """``Room.public`` with who listens, as the owner's routes answer it."""
        counts = await self.directory.languages(room.room_id, self.clock())
        out: dict[str, object] = {**room.public({k: n for k, n in counts.items() if not k.startswith(SPEECH)})}
        out["speech"] = {k.removeprefix(SPEECH): n for k, n in counts.items() if k.startswith(SPEECH)}
        pub = self.publishers.get(room.room_id)
        if pub is not None:  # live here: the record's count is written when the room ends, the publisher's is now
            out["finals"] = max(room.finals, pub.finals)
        return out

    async def list(self, owner: str) -> builtins.list[dict[str, object]]:
        return [await self.describe(r) for r in sorted(await self.directory.rooms_of(owner), key=lambda r: r.created)]

    async def end(self, room_id: str, owner: str) -> Room:
        """Delete the room (``DELETE /v1/rooms/{id}``): every listener gets ``closed`` (reason ``ended by its
        owner``), then the room is forgotten: its tokens open nothing, its history is gone (``not_found``); its
        publisher's stream goes on, no longer published."""
        room = await self.owned(room_id, owner)
        await self._stop_publisher(room)
        if room.state != State.ENDED:
            room.state = State.ENDED
            await self.bus.publish(room_id, {"type": "closed", "finals": room.finals, "reason": "ended by its owner",
                                             "published_at": round(self.clock(), 6)})
        await self._forget(room)
        return room

    async def _stop_publisher(self, room: Room) -> None:
        pub = self.publishers.pop(room.room_id, None)
        if pub is not None:
            room.finals = max(room.finals, pub.finals)
            await pub.close()
            self.metrics.rooms.set(len(self.publishers))

    async def _forget(self, room: Room) -> None:
        await self.directory.forget(room.room_id, room.owner)
        await self.bus.forget(room.room_id)

    async def revoke_key(self, owner: str) -> int:
        """The owner's key was revoked: each of its rooms' listeners is closed (``unauthenticated``, 4401) on every
        gateway and the rooms are forgotten. How many listeners were closed here."""
        closed = 0
        change = AccessChange("owner_revoked", everyone=True)
        for room in await self.directory.rooms_of(owner):
            await self._stop_publisher(room)
            closed += await self._refuse(room.room_id, change)
            await self._forget(room)
        for feed in [f for f in self.feeds.values() if f.owner == owner]:  # rooms already gone from the directory
            closed += feed.apply(change)
        return closed

    def listened_owners(self) -> set[str]:
        """The owner keys of the rooms listened to here (the revoked-key watch asks the store about them)."""
        return {f.owner for f in self.feeds.values() if f.listeners}

    # ---- publishing (RoomHost) ---------------------------------------------------------------------------------
    async def attach(self, session: StreamSession, room: object, key_id: str, ready: Ready,
                     room_targets: object = None) -> None:
        self._check_available()
        spec = session.spec
        resumed = ready.resumed is not None
        room_id = await self.directory.room_of_stream(spec.stream_id) if resumed else None
        if room_id is not None and await self.directory.get(room_id) is None:
            room_id = None  # the room it published into was deleted, or forgotten
        if room_id is None and isinstance(room, str):
            room_id = room
        elif room_id is None and room is not True:
            raise InvalidParameter("room is true (publish this stream as a new room) or the id of a room this key "
                                   "created (POST /v1/rooms)")
        if room_targets is not None and not isinstance(room_targets, list):
            raise InvalidParameter("room_targets lists the languages the room's listeners may add")
        if room_id is None:
            record, token = await self.create(key_id, spec.source_lang, room_targets)  # its first token: ready's
        else:
            record = await self.owned(room_id, key_id)
            if record.state == State.ENDED and not resumed:
                raise InvalidParameter(f"room {room_id} has ended; create another")
            if room_targets is not None:
                record.allowed_targets = self._allowed(spec.source_lang, room_targets)
            token = await self._new_token(record.room_id)  # a room full of tokens is refused before it goes live
        record.state, record.stream_id, record.epoch = State.LIVE, spec.stream_id, record.epoch + 1
        record.source_lang, record.targets = spec.source_lang, list(spec.targets)
        await self.directory.save(record)
        allowed = listenable(record) or frozenset()
        await self._refuse(record.room_id, AccessChange("targets", allowed=tuple(sorted(allowed))))
        old = self.publishers.pop(record.room_id, None)
        if old is not None:
            await old.close()
        if resumed:
            await self._catch_up(record.room_id, session)
        pub = RoomPublisher(record.room_id, session, self.bus, self.directory, clock=self.clock, epoch=record.epoch,
                            low_confidence=lambda t: self.low_confidence(spec.source_lang, t), metrics=self.metrics,
                            allowed=allowed)
        pub.finals = session.seq
        pub.retarget(set((await self.directory.languages(record.room_id, self.clock())).keys()))
        pub.start()
        pub.done.add_done_callback(lambda _t: self._publisher_done(pub))
        self.publishers[record.room_id] = pub
        self.metrics.rooms.set(len(self.publishers))
        ready.room_id, ready.listener_token = record.room_id, token
        ready.listener_token_id = token_id_of_digest(digest(token))

    async def _catch_up(self, room_id: str, session: StreamSession) -> None:
        """A resumed publisher (its server died, or its connection broke): finals it logged but whose room event
        never went out (the tap's queue died with the old server) are published from the stream log first, in
        order, so listeners get 1..N with no gap."""
        if session.journal is None:
            return
        kept = await self.bus.history(room_id, 0)
        last = max((seq_of(e) for e in kept if e.get("type") == "final"), default=0)
        missed = await session.logged_finals_after(last)
        for event in missed:
            if int(event["seq"]) <= session.seq:
                await self.bus.publish(room_id, {**event, "published_at": round(self.clock(), 6)})

    def _publisher_done(self, pub: RoomPublisher) -> None:
        if self.publishers.get(pub.room_id) is pub:
            del self.publishers[pub.room_id]
        self.metrics.rooms.set(len(self.publishers))

    # ---- listening -----------------------------------------------------------------------------------------------
    async def join(self, room_id: str, token: str | None, targets: builtins.list[str], *, after_seq: int = 0,
                   speech: bool = False) -> Listener:
        if not token:
            raise AuthenticationError("a listener token is needed (Authorization: Bearer lt_..., or ?token=)")
        room = await self.directory.get(room_id) if ROOM_ID.match(room_id) else None
        if room is None:  # room ids are 64 random bits: saying one does not exist gives nothing away
            raise NotFound(f"no room {room_id[:40]} (it never existed, was deleted, or ended long enough ago)")
        if not await self.directory.token_ok(room_id, digest(token)):
            raise AuthenticationError("this listener token does not open this room (another room's, revoked by "
                                      "the room's owner, or none)")
        if await self.owner_revoked(room.owner):
            raise AuthenticationError("the room's owner key was revoked: its listener tokens no longer open it")
        langs = self._languages(room, targets)
        if not 0 <= after_seq < 2**53:
            raise InvalidParameter("after_seq must be an integer from 0 to 2**53")
        listener = Listener(room_id, langs, speech, after_seq, token_id=token_id_of_digest(digest(token)))
        if room.state == State.ENDED:
            history = await self.bus.history(room_id, after_seq)
            listener.prime(gap_notice(after_seq, history)
                           + with_closed(encode_history(history, langs), room))
            listener.close()
            return listener
        feed = await self._feed(room_id, room.owner)
        feed.add(listener)
        self._joined()
        try:
            await self._say_presence(room_id)
            history = await self.bus.history(room_id, after_seq)
        except BaseException:
            self.leave(listener, "disconnected")
            raise
        listener.prime(gap_notice(after_seq, history) + encode_history(history, langs))
        return listener

    def _languages(self, room: Room, targets: builtins.list[str]) -> tuple[str, ...]:
        if not targets or len(targets) > MAX_LISTEN_LANGS:
            raise InvalidParameter(f"targets lists 1 to {MAX_LISTEN_LANGS} languages (targets=es,de)")
        out: builtins.list[str] = []
        allowed = listenable(room)
        for t in targets:
            lang = langs_mod.normalize(t, field="targets")
            if allowed is not None and lang not in allowed:  # never added to what the publisher pays for
                raise TargetNotAllowed(f"this room's publisher allows listeners {', '.join(sorted(allowed))}; "
                                       f"not {lang}", details={"allowed": sorted(allowed)})
            if room.source_lang and lang != room.source_lang:
                self.check_pair(room.source_lang, lang)  # 422 unsupported_pair, naming the served pairs
            if lang not in out:
                out.append(lang)
        return tuple(out)

    def _joined(self) -> None:
        self.metrics.joined.inc()
        self.metrics.listeners.set(sum(len(f.listeners) for f in self.feeds.values()))
        if self._presence is None or self._presence.done():
            self._presence = asyncio.create_task(self._presence_loop(), name="room-presence")

    def leave(self, listener: Listener, reason: str) -> None:
        listener.close()
        feed = self.feeds.get(listener.room_id)
        if feed is not None and listener in feed.listeners:
            feed.remove(listener)
            self.metrics.left.labels(reason=reason).inc()
        self.metrics.listeners.set(sum(len(f.listeners) for f in self.feeds.values()))

    async def _feed(self, room_id: str, owner: str) -> Feed:
        async with self._feed_lock:
            feed = self.feeds.get(room_id)
            if feed is None or feed.ended:
                feed = Feed(room_id, self.bus, self._feed_empty, owner)
                await feed.start()
                self.feeds[room_id] = feed
                self.metrics.feeds.set(len(self.feeds))
            return feed

    def _feed_empty(self, feed: Feed) -> None:
        if self.feeds.get(feed.room_id) is feed:
            del self.feeds[feed.room_id]
        feed.cancel()
        self.metrics.feeds.set(len(self.feeds))
        self.metrics.listeners.set(sum(len(f.listeners) for f in self.feeds.values()))

    def _counts(self, room_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        feed = self.feeds.get(room_id)
        for listener in feed.listeners if feed is not None else ():
            for lang in listener.langs:
                counts[lang] = counts.get(lang, 0) + 1
                if listener.speech:  # the publisher synthesizes these languages too (rooms/publisher.py)
                    counts[SPEECH + lang] = counts.get(SPEECH + lang, 0) + 1
        return counts

    async def _say_presence(self, room_id: str) -> None:
        await self.directory.listen(room_id, self.gateway, self._counts(room_id), self.clock() + PRESENCE_TTL_S)

    async def _presence_loop(self) -> None:
        said: set[str] = set()
        while True:
            await asyncio.sleep(PRESENCE_S)
            rooms = set(self.feeds) | said  # a room whose last listener left here: say zero once
            for room_id in rooms:
                try:
                    await self._say_presence(room_id)
                except LinguaFusionError as exc:
                    log.warning("room %s: presence not written: %s", room_id, exc.message)
            said = set(self.feeds)

    async def drain(self, within_s: float = DRAIN_S) -> int:
        """The server is stopping: every listener here ends now, after the events already queued for it, with
        ``draining`` (a WebSocket closes 1012, SSE sends an ``error`` event and ends), so it listens again on a
        server that runs (``after_seq``: nothing is missed); then up to ``within_s`` for their connections to say
        so. Without it, SSE responses held the shutdown for its whole grace and were then cut without a word, and
        WebSocket listeners got the server's 1012 with no event. Returns how many were told."""
        ended = 0
        for feed in list(self.feeds.values()):
            for listener in list(feed.listeners):
                listener.close(Draining("the server is shutting down; listen again with after_seq (the last final "
                                        "you got) to go on"))
                ended += 1
        loop = asyncio.get_running_loop()
        end = loop.time() + within_s
        # each listener's own task sends its last events and leaves: a count, looked at for 2 s at most, once
        while any(f.listeners for f in self.feeds.values()) and loop.time() < end:  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_S)
        return ended

    async def close(self) -> None:
        if self._presence is not None:
            self._presence.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._presence
        for pub in list(self.publishers.values()):
            await pub.close()
        for feed in list(self.feeds.values()):
            for listener in list(feed.listeners):
                listener.close()
            await feed.stop()
        self.publishers.clear()
        self.feeds.clear()
        with contextlib.suppress(Exception):
            await self.bus.close()
        with contextlib.suppress(Exception):
            await self.directory.close()
