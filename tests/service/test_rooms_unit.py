"""Rooms in one process, on the real in-process bus and directory (no server): history then live exactly once
under racing publishes, slow listeners dropped without slowing the others, the projection per language, presence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import REDIS, needs_redis

from lingua_fusion.errors import (
    AuthenticationError,
    InvalidParameter,
    NotFound,
    QuotaExceeded,
    StoreUnavailable,
    UnknownLanguage,
    UnsupportedPair,
)
from lingua_fusion.rooms.bus import LocalRoomBus
from lingua_fusion.rooms.directory import LocalRoomDirectory, RoomLimits
from lingua_fusion.rooms.model import digest, project
from lingua_fusion.rooms.service import RoomService


def final(seq: int, **translations: str) -> dict[str, Any]:
    return {"type": "final", "seq": seq, "start": seq, "end": seq + 1, "source_text": f"s{seq}",
            "text": next(iter(translations.values()), ""), "translations": translations, "confidence": 1.0}


def check_pair(source: str, target: str) -> None:
    if target not in ("es", "ca", "fr", "pt", "de"):
        raise UnsupportedPair(f"no installed model translates {source} -> {target}")


def service(kind: str = "local", max_tokens: int = 10_000, **limits: Any) -> RoomService:
    lim = RoomLimits(max_tokens=max_tokens, **limits)
    if kind == "redis":
        from lingua_fusion.rooms.redis_bus import RedisRoomBus, RedisRoomDirectory

        bus, directory = RedisRoomBus(REDIS or ""), RedisRoomDirectory(REDIS or "", lim)
        return RoomService(bus, directory, check_pair=check_pair, low_confidence=lambda s, t: t == "de")
    return RoomService(LocalRoomBus(), LocalRoomDirectory(lim), check_pair=check_pair,
                       low_confidence=lambda s, t: t == "de")


BUSES = ["local", pytest.param("redis", marks=needs_redis)]


async def live_room(rooms: RoomService) -> tuple[str, str]:
    room, token = await rooms.create("key_owner", "en")
    room.state = "live"
    await rooms.directory.save(room)
    return room.room_id, token


async def end_naturally(rooms: RoomService, room_id: str) -> None:
    """What a publisher does when its stream ends: `closed` on the bus, the record saved as ended."""
    await rooms.bus.publish(room_id, {"type": "closed", "finals": 1, "reason": "end of stream"})
    room = await rooms.directory.get(room_id)
    assert room is not None
    room.state = "ended"
    for gone in await rooms.directory.save(room):
        await rooms.bus.forget(gone)


async def collect(listener: Any, out: list[dict[str, Any]]) -> None:
    async for o in listener.outgoing():
        out.append(o.event)


@pytest.mark.parametrize("kind", BUSES)
async def test_late_joiners_get_history_then_live_exactly_once_while_finals_keep_coming(kind: str) -> None:
    rooms = service(kind)
    room_id, token = await live_room(rooms)
    n = 300

    async def publish() -> None:
        for seq in range(1, n + 1):
            await rooms.bus.publish(room_id, final(seq, es=f"es{seq}", ca=f"ca{seq}"))
            if seq % 7 == 0:
                await asyncio.sleep(0)  # joiners run in between
        await rooms.bus.publish(room_id, {"type": "closed", "finals": n})

    got: list[list[dict[str, Any]]] = []
    readers = []
    publisher = asyncio.create_task(publish())
    for after in (0, 0, 5, 40, 0):
        listener = await rooms.join(room_id, token, ["es"], after_seq=after)
        got.append([])
        readers.append((after, asyncio.create_task(collect(listener, got[-1]))))
        await asyncio.sleep(0)
    await publisher
    await asyncio.wait_for(asyncio.gather(*(t for _a, t in readers)), 10)
    for (after, _task), events in zip(readers, got, strict=True):
        seqs = [e["seq"] for e in events if e["type"] == "final"]
        assert seqs == list(range(after + 1, n + 1))  # gap-free, in order, each once
        assert events[-1]["type"] == "closed"
        assert all(e["translations"] == {"es": f"es{e['seq']}"} and e["text"] == f"es{e['seq']}"
                   for e in events if e["type"] == "final")
    await rooms.close()


async def test_a_slow_listener_is_dropped_and_never_holds_back_the_room_or_the_others() -> None:
    rooms = service()
    room_id, token = await live_room(rooms)
    slow = await rooms.join(room_id, token, ["es"])  # never reads
    fast = await rooms.join(room_id, token, ["ca"])
    got: list[dict[str, Any]] = []
    reader = asyncio.create_task(collect(fast, got))
    for seq in range(1, 601):
        await rooms.bus.publish(room_id, final(seq, es="x", ca=f"c{seq}"))
        await rooms.bus.publish(room_id, {"type": "partial", "source_text": "p", "text": "x", "lang": "es"})
        await asyncio.sleep(0)
    await rooms.bus.publish(room_id, {"type": "closed", "finals": 600})
    await asyncio.wait_for(reader, 10)
    assert [e["seq"] for e in got if e["type"] == "final"] == list(range(1, 601))
    assert slow.closed and slow.error is not None and slow.error.code == "slow_consumer"
    assert "after_seq=" in slow.error.message  # it is told how to catch up from the history
    assert slow not in rooms.feeds.get(room_id, type("F", (), {"listeners": set()})()).listeners
    await rooms.close()


@pytest.mark.parametrize("kind", BUSES)
async def test_tokens_rooms_and_languages_are_checked(kind: str) -> None:
    rooms = service(kind)
    room_id, token = await live_room(rooms)
    other_id, other_token = await live_room(rooms)
    with pytest.raises(AuthenticationError):
        await rooms.join(room_id, other_token, ["es"])  # a token opens its own room only
    with pytest.raises(AuthenticationError):
        await rooms.join(room_id, None, ["es"])
    with pytest.raises(NotFound):
        await rooms.join("rm_" + "0" * 16, token, ["es"])
    with pytest.raises(UnknownLanguage):
        await rooms.join(room_id, token, ["xx"])
    with pytest.raises(UnsupportedPair):
        await rooms.join(room_id, token, ["ja"])
    with pytest.raises(InvalidParameter):
        await rooms.join(room_id, token, [])
    with pytest.raises(InvalidParameter):
        await rooms.join(room_id, token, ["es"] * 9)
    with pytest.raises(NotFound):
        await rooms.owned(room_id, "key_someone_else")  # another key's room does not exist for it
    with pytest.raises(NotFound):
        await rooms.mint("../etc", "key_owner")
    await rooms.close()


@pytest.mark.parametrize("kind", BUSES)
async def test_presence_counts_listeners_per_language_and_an_ended_room_replays_then_closes(kind: str) -> None:
    rooms = service(kind)
    room_id, token = await live_room(rooms)
    a = await rooms.join(room_id, token, ["es", "ca"])
    b = await rooms.join(room_id, token, ["es"])
    assert await rooms.directory.languages(room_id, rooms.clock()) == {"es": 2, "ca": 1}
    await rooms.bus.publish(room_id, final(1, es="uno", ca="un"))
    rooms.leave(a, "done")
    await rooms._say_presence(room_id)
    assert await rooms.directory.languages(room_id, rooms.clock()) == {"es": 1}
    assert await rooms.directory.languages(room_id, rooms.clock() + 60) == {}  # a dead gateway stops counting
    await end_naturally(rooms, room_id)  # as its publisher's stream ends
    got: list[dict[str, Any]] = []
    await asyncio.wait_for(collect(b, got), 5)
    assert [e["type"] for e in got] == ["final", "closed"] and got[-1]["reason"] == "end of stream"
    late = await rooms.join(room_id, token, ["ca"])  # after the end: the history, then closed
    got = []
    await asyncio.wait_for(collect(late, got), 5)
    assert [(e["type"], e.get("translations")) for e in got] == [("final", {"ca": "un"}), ("closed", None)]
    await rooms.close()


def test_what_a_listener_is_sent_is_its_languages_only() -> None:
    e = final(3, es="hola", de="hallo")
    e["low_confidence"] = ["de"]
    p = project(e, ("ca", "es"))
    assert p is not None and p["translations"] == {"es": "hola"} and p["text"] == ""
    assert p["untranslated"] == ["ca"] and "low_confidence" not in p and p["seq"] == 3
    p = project(e, ("de",))
    assert p is not None and p["text"] == "hallo" and p["low_confidence"] == ["de"]
    partial = {"type": "partial", "source_text": "hel", "text": "hol", "lang": "es"}
    assert project(partial, ("es",)) == {"type": "partial", "source_text": "hel", "translations": {"es": "hol"},
                                        "text": "hol"}
    assert project(partial, ("ca",)) == {"type": "partial", "source_text": "hel"}
    speech = {"type": "speech", "seq": 1, "lang": "es", "audio_base64": "AA=="}
    assert project(speech, ("es",)) is None and project(speech, ("es",), speech=True) == speech
    assert project({"type": "metrics"}, ("es",)) is None
    slide = {"type": "slide", "t": 1.0, "source_text": "Review", "translations": {"es": "Revisión", "ca": "Revisió"}}
    assert project(slide, ("ca",)) == {"type": "slide", "t": 1.0, "source_text": "Review",
                                       "translations": {"ca": "Revisió"}}


async def test_the_in_process_bus_keeps_a_bounded_number_of_ended_rooms() -> None:
    from lingua_fusion.rooms.bus import MAX_ENDED_ROOMS

    bus = LocalRoomBus(max_finals=3)
    for seq in range(1, 10):
        await bus.publish("rm_live", final(seq, es="x"))
    assert [e["seq"] for e in await bus.history("rm_live", 0)] == [7, 8, 9]  # the last max_finals
    for i in range(MAX_ENDED_ROOMS + 10):
        await bus.publish(f"rm_{i}", final(1, es="x"))
        await bus.publish(f"rm_{i}", {"type": "closed", "finals": 1})
    assert await bus.history("rm_0", 0) == []  # the oldest ended rooms are dropped
    kept = await bus.history(f"rm_{MAX_ENDED_ROOMS + 9}", 0)
    assert [e["type"] for e in kept] == ["final", "closed"]
    assert [e["seq"] for e in await bus.history("rm_live", 0)] == [7, 8, 9]  # a live room is never dropped


async def test_a_listener_from_further_back_than_the_history_is_told_what_it_missed() -> None:
    rooms = RoomService(LocalRoomBus(max_finals=3), LocalRoomDirectory(), check_pair=check_pair,
                        low_confidence=lambda s, t: False)
    room_id, token = await live_room(rooms)
    for seq in range(1, 10):
        await rooms.bus.publish(room_id, final(seq, es=f"e{seq}"))
    await rooms.bus.publish(room_id, {"type": "closed", "finals": 9})
    got: list[dict[str, Any]] = []
    await asyncio.wait_for(collect(await rooms.join(room_id, token, ["es"], after_seq=2), got), 5)
    assert got[0]["type"] == "error" and got[0]["code"] == "log_compacted" and "3..6" in got[0]["message"]
    assert [e.get("seq") for e in got[1:]] == [7, 8, 9, None]
    got = []
    await asyncio.wait_for(collect(await rooms.join(room_id, token, ["es"], after_seq=6), got), 5)
    assert [e["type"] for e in got] == ["final", "final", "final", "closed"]  # nothing missed: no notice
    await rooms.close()


# ---- the publisher on a real StreamSession (its ModelPort faked: MT upper-cases, every call recorded) ------------
async def published_room(rooms: RoomService) -> tuple[Any, Any, str]:
    from fakes import FakePort, session

    from lingua_fusion.stream.protocol import StreamSpec

    port = FakePort()
    s = session(port, spec=StreamSpec(source_lang="en", targets=["es"], inputs=["text"], key_id="key_owner"))
    ready = await s.open()
    await rooms.attach(s, True, "key_owner", ready, ["ca", "fr", "pt"])  # listeners may add these
    assert ready.room_id is not None and ready.listener_token is not None
    return s, port, ready.room_id


async def test_each_language_is_translated_once_per_final_however_many_listen() -> None:
    from lingua_fusion.rooms.publisher import SYNC_S

    rooms = service()
    s, port, room_id = await published_room(rooms)
    many = {"ca": 50, "fr": 30, "speech:fr": 2}  # 80 listeners on another gateway, two want French spoken
    await rooms.directory.listen(room_id, "gw_other", many, rooms.clock() + 60)
    await asyncio.sleep(SYNC_S * 3)  # the publisher reads who listens
    assert s.spec.targets == ["es", "ca", "fr"]
    await s.feed_text("good morning", ts=0.0)
    await s.end()
    async for _ in s.outgoing():
        pass
    mt = [(k.target, p.text) for k, p, _c in port.calls if k.task == "mt"]
    assert sorted(mt) == [("ca", "good morning"), ("es", "good morning"), ("fr", "good morning")]  # once each
    history = await rooms.bus.history(room_id, 0)
    assert history[0]["translations"] == {"es": "GOOD MORNING", "ca": "GOOD MORNING", "fr": "GOOD MORNING"}
    assert history[-1]["type"] == "closed"
    assert [k.source for k, _p, _c in port.calls if k.task == "tts"] == ["fr"]  # spoken once, for French
    await rooms.directory.listen(room_id, "gw_other", {}, rooms.clock() + 60)  # everyone left
    await rooms.close()


async def test_a_language_nobody_listens_to_any_more_is_dropped_and_an_orphaned_room_ends() -> None:
    from lingua_fusion.rooms.publisher import SYNC_S

    rooms = service()
    s, port, room_id = await published_room(rooms)
    await rooms.directory.listen(room_id, "gw_other", {"ca": 1}, rooms.clock() + 60)
    await asyncio.sleep(SYNC_S * 3)
    assert s.spec.targets == ["es", "ca"]
    await rooms.directory.listen(room_id, "gw_other", {}, rooms.clock() + 60)
    await asyncio.sleep(SYNC_S * 3)
    assert s.spec.targets == ["es"]  # the publisher's own target stays
    rooms.publishers[room_id].orphan_s = 0.05
    s.abort()  # the connection went away: no `closed`, and nobody resumes it
    for _ in range(100):
        room = await rooms.directory.get(room_id)
        if room is not None and room.state == "ended":
            break
        await asyncio.sleep(0.05)
    assert room is not None and room.state == "ended"
    history = await rooms.bus.history(room_id, 0)
    assert history[-1]["type"] == "closed" and history[-1]["reason"] == "the publisher left"
    assert room_id not in rooms.publishers
    await rooms.close()


@needs_redis
async def test_300_listeners_joining_at_once_on_redis_all_get_in_and_other_keys_are_served() -> None:
    """redis-py's default pool raised 'Too many connections' past 100 calls in flight: 300 listeners joining one
    room at once made 200 of them, and another key's room routes meanwhile, fail with state_store_unavailable.
    A call now waits for a free connection."""
    rooms = service("redis")
    room_id, token = await live_room(rooms)
    await rooms.create("key_other", "en")
    joined = await asyncio.gather(*(rooms.join(room_id, token, ["es"]) for _ in range(300)),
                                  *(rooms.list("key_other") for _ in range(30)))
    assert len(joined) == 330 and all(len(mine) == 1 for mine in joined[300:])
    for listener in joined[:300]:
        rooms.leave(listener, "done")
    await rooms.close()


# ---- listener tokens: a cap per room, and expiry -----------------------------------------------------------------
@pytest.mark.parametrize("kind", BUSES)
async def test_a_room_refuses_listener_tokens_past_its_cap_and_the_ones_it_gave_still_open_it(kind: str) -> None:
    rooms = service(kind, max_tokens=4)
    room, first = await rooms.create("key_owner", "en")
    minted = [await rooms.mint(room.room_id, "key_owner") for _ in range(3)]  # 4 with the creation's
    with pytest.raises(QuotaExceeded) as refused:
        await rooms.mint(room.room_id, "key_owner")
    assert refused.value.code == "quota_exceeded"
    assert refused.value.details["limit"] == "max_listener_tokens_per_room" and "4 listener tokens" in str(
        refused.value)
    for token in [first, *minted]:
        assert await rooms.directory.token_ok(room.room_id, digest(token))
    other, _ = await rooms.create("key_owner", "en")  # the cap is per room
    assert await rooms.mint(other.room_id, "key_owner")
    await rooms.close()


def clocked_rooms(max_tokens: int = 10_000) -> tuple[list[float], LocalRoomDirectory, RoomService]:
    """In-process rooms on a clock the test moves (``now[0]``), with a 100 s TTL."""
    now = [1000.0]
    directory = LocalRoomDirectory(RoomLimits(max_tokens=max_tokens, ttl_s=100.0, ended_ttl_s=100.0),
                                   clock=lambda: now[0])
    rooms = RoomService(LocalRoomBus(), directory, check_pair=check_pair, low_confidence=lambda s, t: False,
                        clock=lambda: now[0])
    return now, directory, rooms


async def test_in_process_listener_tokens_expire_a_day_after_the_rooms_last_write_as_on_redis() -> None:
    now, directory, rooms = clocked_rooms(max_tokens=2)
    room, token = await rooms.create("key_owner", "en")
    now[0] += 90
    await directory.save(room)  # a write pushes the expiry on, as EXPIRE does on Redis
    now[0] += 90
    assert await directory.token_ok(room.room_id, digest(token))
    second = await rooms.mint(room.room_id, "key_owner")
    with pytest.raises(QuotaExceeded):
        await rooms.mint(room.room_id, "key_owner")
    now[0] += 101
    assert not await directory.token_ok(room.room_id, digest(token))
    assert not await directory.token_ok(room.room_id, digest(second))
    await directory.save(room)  # the record had expired too; written again, it is back, its old tokens are not
    assert not await directory.token_ok(room.room_id, digest(token))
    assert await rooms.mint(room.room_id, "key_owner")  # the expired ones no longer count against the cap
    await rooms.create("key_owner", "en")
    now[0] += 101
    await rooms.create("key_owner", "en")  # a new room drops the expired rooms with their tokens
    assert room.room_id not in directory._rooms
    await rooms.close()


async def test_in_process_room_records_expire_a_day_after_the_last_save_as_on_redis() -> None:
    """A long-running server without Redis forgets rooms nobody wrote for ``ttl_s``, as Redis does, instead of
    keeping every room it ever made."""
    now, directory, rooms = clocked_rooms()
    room, _ = await rooms.create("key_owner", "en")
    room.stream_id = "s_1"
    now[0] += 90
    await directory.save(room)  # a save pushes the record's expiry on
    now[0] += 90
    assert (await directory.get(room.room_id)) is not None
    assert [r.room_id for r in await directory.rooms_of("key_owner")] == [room.room_id]
    assert await directory.room_of_stream("s_1") == room.room_id
    now[0] += 11
    assert await directory.rooms_of("key_owner") == []
    assert await directory.room_of_stream("s_1") is None
    assert await directory.get(room.room_id) is None
    other, _ = await rooms.create("key_owner", "en")
    now[0] += 101
    await directory.listen(other.room_id, "gw", {"es": 1}, until=now[0] + 5)
    await rooms.create("key_owner", "en")  # a new room drops every expired record, and its presence
    assert other.room_id not in directory._rooms and other.room_id not in directory._presence
    await rooms.close()


@contextlib.asynccontextmanager
async def redis_room() -> AsyncIterator[tuple[Any, Any, Any]]:
    """A room on a Redis-backed service, and a plain Redis client to look at its keys; both closed after."""
    import redis.asyncio as aioredis

    rooms = service("redis")
    room, _ = await rooms.create("key_owner", "en")
    r = aioredis.Redis.from_url(REDIS or "")
    try:
        yield rooms, room, r
    finally:
        await r.aclose()
        await rooms.close()


@needs_redis
async def test_on_redis_a_minted_token_pushes_the_token_sets_expiry_on() -> None:
    from lingua_fusion.state import redis_keys as keys

    async with redis_room() as (rooms, room, r):
        await r.persist(keys.room_tokens(room.room_id))  # as if the set had been re-made by a bare SADD
        await rooms.mint(room.room_id, "key_owner")
        assert 0 < await r.ttl(keys.room_tokens(room.room_id)) <= 24 * 3600


async def test_rooms_without_their_redis_say_the_rooms_store_is_unavailable_not_the_stream_log() -> None:
    from conftest import free_port

    from lingua_fusion.rooms.redis_bus import RedisRoomDirectory

    directory = RedisRoomDirectory(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(StoreUnavailable) as failed:
        await directory.get("rm_0123456789abcdef")
    assert failed.value.code == "state_store_unavailable" and failed.value.retryable
    assert "rooms" in failed.value.public_message and "stream log" not in failed.value.public_message
    await directory.close()


def test_listen_announces_each_break_once_before_retrying() -> None:
    """``listen(on_break=...)``: a broken listener connection is announced once when reconnecting starts (the CLI
    prints "connection lost; reconnecting"), not at each failed try, and again at the next break."""
    from lingua_fusion.sdk.rooms import _State

    said: list[float] = []
    st = _State(0, reconnect_timeout=60.0, on_break=said.append)
    for code in (1012, None, 1012):  # one break: three tries that fail
        assert st.broken(code) > 0
    assert said == [60.0]
    assert st.event('{"type": "partial", "text": "x"}') is not None  # an event: the connection works again
    st.broken(1012)
    assert said == [60.0, 60.0]


async def test_a_room_live_for_longer_than_its_ttl_is_not_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher pushes its room's expiry on while the room is live (RoomDirectory.touch), so a conference
    longer than the TTL can still be joined and ended by its owner; once it has ended, the TTL runs again."""
    from lingua_fusion.rooms import publisher

    monkeypatch.setattr(publisher, "TOUCH_S", 30.0)
    now, directory, rooms = clocked_rooms()
    s, _port, room_id = await published_room(rooms)
    token = await rooms.mint(room_id, "key_owner")
    for _ in range(8):  # 320 s on the rooms' clock; the publisher looks every 0.5 s
        now[0] += 40
        await asyncio.sleep(publisher.SYNC_S * 2)
    assert (await directory.get(room_id)) is not None
    assert await directory.token_ok(room_id, digest(token))
    await s.end()
    async for _ in s.outgoing():
        pass
    now[0] += 101
    assert await directory.get(room_id) is None
    await rooms.close()


async def test_touch_pushes_a_room_on_and_a_dropped_room_takes_no_presence() -> None:
    now, directory, rooms = clocked_rooms()
    room, _ = await rooms.create("key_owner", "en")
    now[0] += 90
    await directory.touch(room)
    now[0] += 90
    assert await directory.get(room.room_id) is not None
    now[0] += 101
    await directory.touch(room)  # too late: an expired room is not brought back
    assert await directory.get(room.room_id) is None
    await directory.listen(room.room_id, "gw", {"es": 1}, until=now[0] + 60)  # a feed's presence loop, still going
    assert room.room_id not in directory._presence
    await rooms.close()


@needs_redis
async def test_on_redis_touch_pushes_a_rooms_keys_expiry_on() -> None:
    from lingua_fusion.state import redis_keys as keys

    async with redis_room() as (rooms, room, r):
        for key in (keys.room(room.room_id), keys.room_tokens(room.room_id)):
            await r.expire(key, 5)
        await rooms.directory.touch(room)
        assert await r.ttl(keys.room(room.room_id)) > 3600 and await r.ttl(keys.room_tokens(room.room_id)) > 3600


async def test_listen_gives_up_on_a_server_that_accepts_and_closes_at_once() -> None:
    """A gateway that accepts the listener and closes straight away (draining: 1012) is one break, not a new one
    per try: the listener announces it once and gives up after its reconnect timeout instead of retrying for
    ever."""
    from websockets.asyncio.server import serve

    from lingua_fusion.errors import BackendError
    from lingua_fusion.sdk.rooms import alisten

    async def handler(ws: Any) -> None:
        await ws.close(1012)

    said: list[float] = []
    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]

        async def run() -> None:
            async for _ in alisten(f"http://127.0.0.1:{port}", "rm_0123456789abcdef", "lt_x", ["es"],
                                   reconnect_timeout=1.5, on_break=said.append):
                pass

        with pytest.raises(BackendError):
            await asyncio.wait_for(run(), 30)
    assert said == [1.5]


# ---- issue 29: caps, indexes, revocation, allowed languages ------------------------------------------------------
def owner() -> str:
    """A key of its own per test: the Redis of a run is shared by every test in it."""
    import secrets

    return "key_" + secrets.token_hex(4)


@pytest.mark.parametrize("kind", BUSES)
async def test_open_rooms_are_capped_per_key_and_ended_ones_evicted_oldest_first_with_their_history(kind: str
                                                                                                    ) -> None:
    rooms = service(kind, max_open_per_key=2, max_ended_per_key=1)
    me = owner()
    first, _ = await rooms.create(me, "en")
    second, _ = await rooms.create(me, "en")  # exactly the limit
    with pytest.raises(QuotaExceeded) as refused:
        await rooms.create(me, "en")  # one past it
    assert refused.value.details == {"limit": "max_rooms_per_key", "max": 2}
    assert (await rooms.create(owner(), "en"))[0]  # per key
    for room in (first, second):
        await rooms.bus.publish(room.room_id, final(1, es="uno"))
        await end_naturally(rooms, room.room_id)
    assert await rooms.directory.get(first.room_id) is None  # the oldest ended room is forgotten...
    assert await rooms.bus.history(first.room_id, 0) == []  # ...with its history
    kept = await rooms.bus.history(second.room_id, 0)
    assert [e["type"] for e in kept] == ["final", "closed"]
    third, _ = await rooms.create(me, "en")  # ending freed a place
    assert sorted((r.room_id, r.state) for r in await rooms.directory.rooms_of(me)) == sorted(
        [(second.room_id, "ended"), (third.room_id, "waiting")])
    await rooms.close()


async def test_the_in_process_directory_keeps_nothing_of_deleted_rooms_and_finds_rooms_without_a_scan() -> None:
    rooms = service()
    for _ in range(300):
        room, _t = await rooms.create("key_churn", "en")
        await rooms.end(room.room_id, "key_churn")
    directory = rooms.directory
    assert isinstance(directory, LocalRoomDirectory) and isinstance(rooms.bus, LocalRoomBus)
    assert directory._rooms == {} and directory._open == {} and directory._ended == {}
    assert rooms.bus._rooms == {} and rooms.bus._ended == {}
    await rooms.close()


async def test_in_process_ended_rooms_are_forgotten_after_ended_ttl_s() -> None:
    now, directory, rooms = clocked_rooms()  # ttl_s and ended_ttl_s: 100 s
    room, token = await rooms.create("key_owner", "en")
    await end_naturally(rooms, room.room_id)
    now[0] += 50
    assert await directory.token_ok(room.room_id, digest(token))  # the history is readable for a while
    now[0] += 51
    await rooms.create("key_owner", "en")
    assert room.room_id not in directory._rooms and directory._ended.get("key_owner") is None
    await rooms.close()


@pytest.mark.parametrize("kind", BUSES)
async def test_a_revoked_token_is_refused_and_its_listener_closed_while_a_sibling_listens_on(kind: str) -> None:
    from lingua_fusion.rooms.model import token_id_of

    rooms = service(kind)
    room_id, first = await live_room(rooms)
    sibling = await rooms.mint(room_id, "key_owner", label="back row")
    assert [t["label"] for t in await rooms.tokens(room_id, "key_owner")] == [None, "back row"]
    a, b = await rooms.join(room_id, first, ["es"]), await rooms.join(room_id, sibling, ["es"])
    with pytest.raises(NotFound):
        await rooms.revoke_token(room_id, "key_someone_else", token_id_of(first))
    assert await rooms.revoke_token(room_id, "key_owner", token_id_of(first)) == 1
    assert a.closed and isinstance(a.error, AuthenticationError) and "revoked" in a.error.message
    assert not b.closed
    with pytest.raises(AuthenticationError):
        await rooms.join(room_id, first, ["es"])
    assert await rooms.join(room_id, sibling, ["es"])
    with pytest.raises(NotFound):
        await rooms.revoke_token(room_id, "key_owner", token_id_of(first))  # already gone
    assert [t["token_id"] for t in await rooms.tokens(room_id, "key_owner")] == [token_id_of(sibling)]
    await rooms.close()


@needs_redis
async def test_on_redis_a_token_revoked_on_one_gateway_closes_its_listener_on_another() -> None:
    from lingua_fusion.rooms.model import token_id_of

    a, b = service("redis"), service("redis")  # two gateways, one Redis
    room_id, token = await live_room(a)
    sibling = await a.mint(room_id, "key_owner")
    far, near = await b.join(room_id, token, ["es"]), await b.join(room_id, sibling, ["es"])
    assert await a.revoke_token(room_id, "key_owner", token_id_of(token)) == 0  # nobody listens on a
    for _ in range(100):
        if far.closed:
            break
        await asyncio.sleep(0.05)
    assert far.closed and isinstance(far.error, AuthenticationError) and not near.closed
    await a.close()
    await b.close()


@pytest.mark.parametrize("kind", BUSES)
async def test_a_revoked_owner_key_refuses_its_rooms_tokens_and_closes_their_listeners(kind: str) -> None:
    revoked: set[str] = set()
    rooms = service(kind)

    async def owner_revoked(key_id: str) -> bool:
        return key_id in revoked

    rooms.owner_revoked = owner_revoked
    room_id, token = await live_room(rooms)
    listener = await rooms.join(room_id, token, ["es"])
    assert rooms.listened_owners() == {"key_owner"}  # the revoked-key watch asks the store about it
    revoked.add("key_owner")  # revoked elsewhere (the CLI): the next join asks the store
    with pytest.raises(AuthenticationError):
        await rooms.join(room_id, token, ["es"])
    assert await rooms.revoke_key("key_owner") == 1
    assert listener.closed and isinstance(listener.error, AuthenticationError)
    assert await rooms.directory.get(room_id) is None  # its rooms are forgotten
    await rooms.close()


@pytest.mark.parametrize("kind", BUSES)
async def test_a_listener_may_pick_only_the_languages_the_room_allows(kind: str) -> None:
    from lingua_fusion.errors import TargetNotAllowed

    rooms = service(kind)
    room, token = await rooms.create(owner(), "en", ["ca"])
    room.state, room.targets = "live", ["es"]  # as a publisher with target es attached
    await rooms.directory.save(room)
    assert (await rooms.join(room.room_id, token, ["ca", "es", "en"])).langs == ("ca", "es", "en")
    with pytest.raises(TargetNotAllowed) as refused:
        await rooms.join(room.room_id, token, ["es", "fr"])  # served, not allowed here
    assert refused.value.status == 403 and refused.value.details["allowed"] == ["ca", "en", "es"]
    with pytest.raises(UnsupportedPair):
        await rooms.create(owner(), "en", ["ja"])
    with pytest.raises(InvalidParameter):
        await rooms.create(owner(), "en", ["es"] * 40)
    await rooms.close()


async def test_the_publisher_never_pays_for_a_language_the_room_does_not_allow() -> None:
    from lingua_fusion.rooms.publisher import SYNC_S

    rooms = service()
    s, _port, room_id = await published_room(rooms)  # targets es, room_targets ca, fr, pt
    await rooms.directory.listen(room_id, "gw_other", {"ca": 1, "de": 5, "speech:de": 1}, rooms.clock() + 60)
    await asyncio.sleep(SYNC_S * 3)
    assert s.spec.targets == ["es", "ca"] and rooms.publishers[room_id].speech_langs == set()
    await s.end()
    async for _ in s.outgoing():
        pass
    await rooms.close()


def test_an_access_change_says_whom_it_refuses() -> None:
    from lingua_fusion.rooms.model import AccessChange

    revoked = AccessChange("token_revoked", revoked=("tk_1",))
    assert revoked.refuses("tk_1", ("es",)) == "token" and revoked.refuses("tk_2", ("es",)) is None
    assert AccessChange("owner_revoked", everyone=True).refuses("tk_2", ("es",)) == "token"
    narrowed = AccessChange("targets", allowed=("en", "es"))
    assert narrowed.refuses("tk_1", ("es",)) is None and narrowed.refuses("tk_1", ("es", "fr")) == "language"
    assert AccessChange.from_wire(narrowed.to_wire()) == narrowed
