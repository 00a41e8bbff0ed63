"""``RoomBus`` and ``RoomDirectory`` on Redis, so every gateway sharing one Redis serves every room.

Live events go to a Redis stream per room (``XADD ... MAXLEN ~``); each gateway runs one follower per room it has
listeners for (``XREAD BLOCK``), never one connection per listener. A final is written, in the same MULTI, to a
sorted set scored by its seq (the last ``max_finals`` kept): a late joiner reads it with ``ZRANGEBYSCORE``. Every key
expires ``ttl_s`` after its last write, an ended room's ``ended_ttl_s`` after it ended. The directory indexes each
owner's open and ended rooms in two sorted sets scored by expiry (``create`` checks the open cap in one Lua step,
so gateways creating at once cannot pass it together; ``save`` of an ended room forgets the oldest ended ones past
``max_ended_per_key``); listener tokens are a hash by token id. Calls time out (socket timeouts); a failure is
``StoreUnavailable`` (503, retryable), and a follower that loses Redis retries from where it was.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..errors import StoreUnavailable
from ..state import redis_keys as keys
from .bus import ENDED_TTL_S, KEPT, MAX_FINALS, MAX_LIVE, TTL_S, RoomEvent, kept_seq, names_first
from .directory import RoomLimits
from .model import ACCESS, Room, State, TokenInfo, token_id_of_digest

T = TypeVar("T")
log = logging.getLogger("lingua_fusion.rooms")
BLOCK_MS = 1000
TIMEOUT_S = 5.0  # socket timeout: longer than an XREAD's block
MAX_CONNECTIONS = 100  # per client (bus, directory): a call beyond waits for one, up to TIMEOUT_S
FORGET_LIVE_S = 30  # a forgotten room's live feed stays this long, so followers elsewhere read its last events
# add a token (KEYS[1] hash) unless the room is gone (KEYS[2]) or has ARGV[3] tokens (0), and push the room's
# expiry on (record, tokens, the owner's index KEYS[3]): one step, so gateways minting at once cannot pass the cap
ADD_TOKEN = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], 'XX', ARGV[5], ARGV[6])
return 1
"""
# make a room unless its owner's open set (KEYS[1], expired entries dropped first) holds ARGV[8] rooms
CREATE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[5])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[8]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[7])
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[7])
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[7])
return 1
"""


def _secs(s: float) -> int:
    return max(1, math.ceil(s))


def _client(url: str) -> Any:  # redis-py types every reply bytes | str: decode_responses=True makes them str
    """A client whose pool makes a call wait (up to TIMEOUT_S) for a free connection when all MAX_CONNECTIONS are
    in use. redis-py's default pool raised 'Too many connections' instead: 300 listeners joining one room at once
    made 200 of them, and every other key's room routes meanwhile, fail with 503."""
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS, timeout=TIMEOUT_S,
                                                    socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                                                    decode_responses=True)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() disconnects it


async def _call(fn: Callable[[], Awaitable[T]]) -> T:
    import redis

    try:
        return await fn()
    except (redis.RedisError, OSError) as exc:
        raise StoreUnavailable(f"rooms: Redis failed: {exc}", store="the rooms' state store (Redis)") from exc


def _event(raw: str | bytes) -> RoomEvent:
    """A room event read back from Redis (``publish`` wrote it as a JSON object)."""
    event: object = json.loads(raw)
    if not isinstance(event, dict):
        raise TypeError(f"a room event on Redis is {type(event).__name__}, not an object")
    return event


class RedisRoomBus:
    def __init__(self, url: str, *, max_finals: int = MAX_FINALS, ttl_s: float = TTL_S,
                 ended_ttl_s: float = ENDED_TTL_S) -> None:
        self._r = _client(url)
        self._url = url
        self.max_finals = max_finals
        self.ttl_s = ttl_s
        self.ended_ttl_s = ended_ttl_s

    async def publish(self, room_id: str, event: RoomEvent) -> None:
        body = json.dumps(event, ensure_ascii=False)

        ttl = _secs(self.ended_ttl_s if event.get("type") in ("closed", ACCESS) else self.ttl_s)

        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            if event.get("type") in KEPT:
                seq = kept_seq(event)
                fin = keys.room_finals(room_id)
                pipe.zremrangebyscore(fin, seq, seq)  # idempotent: a final published again replaces itself
                pipe.zadd(fin, {body: seq})
                if event["type"] == "final":  # the last max_finals finals kept (and `closed`, scored past them)
                    pipe.zremrangebyscore(fin, "-inf", seq - self.max_finals)
                pipe.expire(fin, ttl)
            pipe.xadd(keys.room_live(room_id), {"e": body}, maxlen=MAX_LIVE, approximate=True)
            pipe.expire(keys.room_live(room_id), ttl)
            await pipe.execute()

        await _call(run)

    async def history(self, room_id: str, after_seq: int) -> list[RoomEvent]:
        rows = await _call(lambda: self._r.zrangebyscore(keys.room_finals(room_id), f"({after_seq}", "+inf"))
        out: dict[int, RoomEvent] = {}
        for raw in rows:
            e = _event(raw)
            out[kept_seq(e)] = e
        return names_first([out[s] for s in sorted(out)])

    async def position(self, room_id: str) -> str:
        last = await _call(lambda: self._r.xrevrange(keys.room_live(room_id), "+", "-", count=1))
        return str(last[0][0]) if last else "0-0"

    async def follow(self, room_id: str, position: str) -> AsyncIterator[RoomEvent]:
        """One connection of its own (an XREAD BLOCK holds it); a lost Redis is retried with backoff from the
        last id read, so the follower misses nothing still within MAXLEN."""
        import redis

        r = _client(self._url)
        key, last, delay = keys.room_live(room_id), position, 0.25
        try:
            while True:
                try:
                    got = await r.xread({key: last}, block=BLOCK_MS, count=256)
                    delay = 0.25
                except (redis.RedisError, OSError) as exc:
                    log.warning("room %s: following the live feed failed (%s); retrying in %.2f s", room_id, exc,
                                delay)
                    await asyncio.sleep(delay)
                    delay = min(5.0, delay * 2)
                    continue
                for _stream, entries in got or ():
                    for entry_id, fields in entries:
                        last = entry_id
                        yield _event(fields["e"])
        finally:
            await r.aclose()

    async def forget(self, room_id: str) -> None:
        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.delete(keys.room_finals(room_id))
            pipe.expire(keys.room_live(room_id), FORGET_LIVE_S)
            await pipe.execute()

        await _call(run)

    async def close(self) -> None:
        await self._r.aclose()


class RedisRoomDirectory:
    def __init__(self, url: str, limits: RoomLimits | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._r = _client(url)
        self.limits = limits or RoomLimits()
        self.clock = clock  # the owner indexes' scores: wall-clock expiry times

    def _ttl(self, room: Room) -> int:
        return _secs(self.limits.ttl_for(room))

    async def create(self, room: Room, token: TokenInfo) -> bool:
        now, ttl = self.clock(), self._ttl(room)
        made = await _call(lambda: self._r.eval(
            CREATE, 3, keys.rooms_open_of_owner(room.owner), keys.room(room.room_id), keys.room_tokens(room.room_id),
            room.room_id, json.dumps(room.to_dict()), token.token_id, token.to_json(), now, now + ttl, ttl,
            self.limits.max_open_per_key))
        return int(made) == 1

    async def get(self, room_id: str) -> Room | None:
        raw = await _call(lambda: self._r.get(keys.room(room_id)))
        return Room.from_dict(json.loads(raw)) if raw else None

    async def save(self, room: Room) -> list[str]:
        ended, ttl, now = room.state == State.ENDED, self._ttl(room), self.clock()
        open_, ended_set = keys.rooms_open_of_owner(room.owner), keys.rooms_ended_of_owner(room.owner)

        async def run() -> list[str]:
            pipe = self._r.pipeline(transaction=True)
            pipe.set(keys.room(room.room_id), json.dumps(room.to_dict()), ex=ttl)
            pipe.expire(keys.room_tokens(room.room_id), ttl)
            if room.stream_id:
                pipe.set(keys.room_of_stream(room.stream_id), room.room_id, ex=ttl)
            pipe.zrem(open_ if ended else ended_set, room.room_id)
            pipe.zadd(ended_set if ended else open_, {room.room_id: now + ttl})
            for key in (open_, ended_set):
                pipe.expire(key, _secs(self.limits.ttl_s))
            if ended:  # beyond the newest max_ended_per_key: forgotten, the oldest first
                pipe.zremrangebyscore(ended_set, "-inf", now)
                pipe.zrange(ended_set, 0, -(self.limits.max_ended_per_key + 1))
            done = await pipe.execute()
            return list(done[-1]) if ended else []

        gone = await _call(run)
        for room_id in gone:
            await self.forget(room_id, room.owner)
        return gone

    async def touch(self, room: Room) -> None:
        ttl, now = self._ttl(room), self.clock()
        index = (keys.rooms_ended_of_owner if room.state == State.ENDED else keys.rooms_open_of_owner)(room.owner)

        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            for key in (keys.room(room.room_id), keys.room_tokens(room.room_id), index):
                pipe.expire(key, ttl)
            pipe.zadd(index, {room.room_id: now + ttl}, xx=True)
            if room.stream_id:
                pipe.expire(keys.room_of_stream(room.stream_id), ttl)
            await pipe.execute()

        await _call(run)

    async def forget(self, room_id: str, owner: str) -> None:
        raw = await _call(lambda: self._r.get(keys.room(room_id)))
        stream_id = json.loads(raw).get("stream_id") if raw else None

        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.delete(keys.room(room_id), keys.room_tokens(room_id), keys.room_presence(room_id))
            pipe.zrem(keys.rooms_open_of_owner(owner), room_id)
            pipe.zrem(keys.rooms_ended_of_owner(owner), room_id)
            if stream_id:
                pipe.delete(keys.room_of_stream(stream_id))
            await pipe.execute()

        await _call(run)

    async def rooms_of(self, owner: str) -> list[Room]:
        now = self.clock()
        open_, ended = keys.rooms_open_of_owner(owner), keys.rooms_ended_of_owner(owner)

        async def run() -> list[str]:
            pipe = self._r.pipeline(transaction=True)
            for key in (open_, ended):
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.zrange(key, 0, -1)
            done = await pipe.execute()
            return [*done[1], *done[3]]

        ids = await _call(run)
        if not ids:
            return []
        raws = await _call(lambda: self._r.mget([keys.room(i) for i in ids]))
        return [Room.from_dict(json.loads(r)) for r in raws if r]

    async def room_of_stream(self, stream_id: str) -> str | None:
        got: str | None = await _call(lambda: self._r.get(keys.room_of_stream(stream_id)))
        return got

    async def add_token(self, room_id: str, token: TokenInfo) -> bool:
        room = await self.get(room_id)
        if room is None:
            return False
        ttl = self._ttl(room)
        index = (keys.rooms_ended_of_owner if room.state == State.ENDED else keys.rooms_open_of_owner)(room.owner)
        added = await _call(lambda: self._r.eval(ADD_TOKEN, 3, keys.room_tokens(room_id), keys.room(room_id), index,
                                                 token.token_id, token.to_json(), self.limits.max_tokens, ttl,
                                                 self.clock() + ttl, room_id))
        return int(added) == 1

    async def token_ok(self, room_id: str, token_digest: str) -> bool:
        raw = await _call(lambda: self._r.hget(keys.room_tokens(room_id), token_id_of_digest(token_digest)))
        if not raw:
            return False
        return hmac.compare_digest(TokenInfo.from_json(token_id_of_digest(token_digest), raw).digest, token_digest)

    async def tokens(self, room_id: str) -> list[TokenInfo]:
        raw = await _call(lambda: self._r.hgetall(keys.room_tokens(room_id)))
        return sorted((TokenInfo.from_json(tid, v) for tid, v in raw.items()), key=lambda t: t.created)

    async def remove_token(self, room_id: str, token_id: str) -> bool:
        return bool(await _call(lambda: self._r.hdel(keys.room_tokens(room_id), token_id)))

    async def listen(self, room_id: str, gateway: str, counts: dict[str, int], until: float) -> None:
        """Members ``gateway|lang|count`` scored by expiry; this gateway's previous members are replaced."""
        key = keys.room_presence(room_id)

        async def run() -> None:
            members = await self._r.zrange(key, 0, -1)
            pipe = self._r.pipeline(transaction=True)
            mine = [m for m in members if m.startswith(gateway + "|")]
            if mine:
                pipe.zrem(key, *mine)
            fresh = {f"{gateway}|{lang}|{n}": until for lang, n in counts.items() if n > 0}
            if fresh:
                pipe.zadd(key, fresh)
            pipe.expire(key, _secs(self.limits.ttl_s))
            await pipe.execute()

        await _call(run)

    async def languages(self, room_id: str, now: float) -> dict[str, int]:
        key = keys.room_presence(room_id)

        async def run() -> list[str]:
            pipe = self._r.pipeline(transaction=False)
            pipe.zremrangebyscore(key, "-inf", now)  # expired presence: a gateway that died stops counting
            pipe.zrangebyscore(key, now, "+inf")
            return list((await pipe.execute())[1])

        out: dict[str, int] = {}
        for member in await _call(run):
            _gw, lang, n = member.rsplit("|", 2)
            out[lang] = out.get(lang, 0) + int(n)
        return out

    async def close(self) -> None:
        await self._r.aclose()
