"""``RoomBus`` and ``RoomDirectory`` on Redis, so every gateway sharing one Redis serves every room.

Live events go to a Redis stream per room (``XADD ... MAXLEN ~``); each gateway runs one follower per room it has
listeners for (``XREAD BLOCK``), never one connection per listener. A final is written, in the same MULTI, to a
sorted set scored by its seq (the last ``max_finals`` kept): a late joiner reads it with ``ZRANGEBYSCORE``. Every key
expires ``ttl_s`` after its last write. Calls time out (socket timeouts); a failure is ``StoreUnavailable`` (503,
retryable), and a follower that loses Redis retries from where it was.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..errors import StoreUnavailable
from ..state import redis_keys as keys
from .bus import CLOSED_SEQ, MAX_FINALS, MAX_LIVE, MAX_TOKENS, TTL_S
from .model import Room

T = TypeVar("T")
log = logging.getLogger("lingua_fusion.rooms")
BLOCK_MS = 1000
TIMEOUT_S = 5.0  # socket timeout: longer than an XREAD's block
MAX_CONNECTIONS = 100  # per client (bus, directory): a call beyond waits for one, up to TIMEOUT_S
# add a token unless the set holds ARGV[2] already (-1), and push the set's expiry on: one step, so that gateways
# minting at once cannot pass the cap together
ADD_TOKEN = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return -1
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


def _client(url: str) -> Any:
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


class RedisRoomBus:
    def __init__(self, url: str, *, max_finals: int = MAX_FINALS, ttl_s: int = 24 * 3600) -> None:
        self._r = _client(url)
        self._url = url
        self.max_finals = max_finals
        self.ttl_s = ttl_s

    async def publish(self, room_id: str, event: dict[str, Any]) -> None:
        body = json.dumps(event, ensure_ascii=False)

        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            if event.get("type") in ("final", "closed"):
                seq = int(event["seq"]) if event["type"] == "final" else CLOSED_SEQ
                fin = keys.room_finals(room_id)
                pipe.zremrangebyscore(fin, seq, seq)  # idempotent: a final published again replaces itself
                pipe.zadd(fin, {body: seq})
                if event["type"] == "final":  # the last max_finals finals kept (and `closed`, scored past them)
                    pipe.zremrangebyscore(fin, "-inf", seq - self.max_finals)
                pipe.expire(fin, self.ttl_s)
            pipe.xadd(keys.room_live(room_id), {"e": body}, maxlen=MAX_LIVE, approximate=True)
            pipe.expire(keys.room_live(room_id), self.ttl_s)
            await pipe.execute()

        await _call(run)

    async def history(self, room_id: str, after_seq: int) -> list[dict[str, Any]]:
        rows = await _call(lambda: self._r.zrangebyscore(keys.room_finals(room_id), f"({after_seq}", "+inf"))
        out: dict[int, dict[str, Any]] = {}
        for raw in rows:
            e = json.loads(raw)
            out[int(e["seq"]) if e.get("type") == "final" else CLOSED_SEQ] = e
        return [out[s] for s in sorted(out)]

    async def position(self, room_id: str) -> str:
        last = await _call(lambda: self._r.xrevrange(keys.room_live(room_id), "+", "-", count=1))
        return str(last[0][0]) if last else "0-0"

    async def follow(self, room_id: str, position: str) -> AsyncIterator[dict[str, Any]]:
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
                        yield json.loads(fields["e"])
        finally:
            await r.aclose()

    async def close(self) -> None:
        await self._r.aclose()


class RedisRoomDirectory:
    def __init__(self, url: str, *, max_tokens: int = MAX_TOKENS, ttl_s: int = TTL_S) -> None:
        self._r = _client(url)
        self.max_tokens = max_tokens
        self.ttl_s = ttl_s

    async def create(self, room: Room, token_digest: str) -> None:
        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.set(keys.room(room.room_id), json.dumps(room.to_dict()), ex=self.ttl_s)
            pipe.sadd(keys.room_tokens(room.room_id), token_digest)
            pipe.expire(keys.room_tokens(room.room_id), self.ttl_s)
            pipe.sadd(keys.rooms_of_owner(room.owner), room.room_id)
            pipe.expire(keys.rooms_of_owner(room.owner), self.ttl_s)
            await pipe.execute()

        await _call(run)

    async def get(self, room_id: str) -> Room | None:
        raw = await _call(lambda: self._r.get(keys.room(room_id)))
        return Room.from_dict(json.loads(raw)) if raw else None

    async def save(self, room: Room) -> None:
        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.set(keys.room(room.room_id), json.dumps(room.to_dict()), ex=self.ttl_s)
            pipe.expire(keys.room_tokens(room.room_id), self.ttl_s)
            if room.stream_id:
                pipe.set(keys.room_of_stream(room.stream_id), room.room_id, ex=self.ttl_s)
            await pipe.execute()

        await _call(run)

    async def touch(self, room: Room) -> None:
        async def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            for key in (keys.room(room.room_id), keys.room_tokens(room.room_id), keys.rooms_of_owner(room.owner)):
                pipe.expire(key, self.ttl_s)
            if room.stream_id:
                pipe.expire(keys.room_of_stream(room.stream_id), self.ttl_s)
            await pipe.execute()

        await _call(run)

    async def rooms_of(self, owner: str) -> list[Room]:
        ids = sorted(await _call(lambda: self._r.smembers(keys.rooms_of_owner(owner))))
        if not ids:
            return []
        raws = await _call(lambda: self._r.mget([keys.room(i) for i in ids]))
        return [Room.from_dict(json.loads(r)) for r in raws if r]

    async def room_of_stream(self, stream_id: str) -> str | None:
        got: str | None = await _call(lambda: self._r.get(keys.room_of_stream(stream_id)))
        return got

    async def add_token(self, room_id: str, token_digest: str) -> bool:
        added = await _call(lambda: self._r.eval(ADD_TOKEN, 1, keys.room_tokens(room_id), token_digest,
                                                 self.max_tokens, self.ttl_s))
        return int(added) == 1

    async def token_ok(self, room_id: str, token_digest: str) -> bool:
        return bool(await _call(lambda: self._r.sismember(keys.room_tokens(room_id), token_digest)))

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
            pipe.expire(key, self.ttl_s)
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
