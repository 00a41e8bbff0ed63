"""The per-key stream cap on Redis (``RedisKeyQuota``), exact across every server on it: stream/quota.py says how
(leases, the holder, what happens while Redis is down). Imported only when ``state.redis_url`` is set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from ..errors import StoreUnavailable
from ..state import redis_keys as rk
from .quota import too_many_streams

log = logging.getLogger("lingua_fusion.stream")
MAX_PENDING = 10_000  # releases waiting for Redis; past it the oldest lapse with their leases

# both scripts begin on Redis's clock (``now``) by dropping the leases lapsed by it, with their holders
LAPSED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('HDEL', KEYS[2], unpack(gone))
end
"""
# KEYS: the key's lease set, its holders; ARGV: limit, lease_s, stream id, gateway. 1 taken (or held already), 0 full
TAKE = LAPSED + """
local lease = tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(lease) * 2)
redis.call('EXPIRE', KEYS[2], math.ceil(lease) * 2)
return 1
"""
# KEYS: as TAKE; ARGV: lease_s, gateway, limit, then the stream ids this gateway holds. A slot held by this gateway
# is renewed; one that lapsed (this gateway away from Redis past a lease) comes back only within the cap; one that
# another gateway holds now (a resume there) is not this one's. How many lapsed slots found the cap full
RENEW = LAPSED + """
local lease = tonumber(ARGV[1])
local over = 0
for i = 4, #ARGV do
  local holder = redis.call('HGET', KEYS[2], ARGV[i])
  if holder == ARGV[2] then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  elseif holder == false then
    if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
      redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[2])
    else
      over = over + 1
    end
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(lease) * 2)
redis.call('EXPIRE', KEYS[2], math.ceil(lease) * 2)
return over
"""
RELEASE = """
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
return 1
"""



class RedisKeyQuota:
    def __init__(self, url: str, limit: int, *, lease_s: float = 30.0, timeout_s: float = 2.0) -> None:
        self.limit = limit
        self.lease_s = lease_s
        self.gateway = "gw_" + secrets.token_hex(6)  # this process, as a slot's holder
        self._r = aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                    decode_responses=True)
        self._take = self._r.register_script(TAKE)
        self._renew = self._r.register_script(RENEW)
        self._release = self._r.register_script(RELEASE)
        self._held: dict[str, str] = {}  # stream id -> key id, held here
        self._pending: dict[str, str] = {}  # stream id -> key id, let go here, not yet released on Redis
        self._wake = asyncio.Event()

    async def take(self, key_id: str, stream_id: str) -> None:
        try:
            got = await self._take(keys=[rk.stream_quota(key_id), rk.stream_quota_holders(key_id)],
                                   args=[self.limit, self.lease_s, stream_id, self.gateway])
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"the stream quota (Redis) failed: {exc}", store="the stream quota") from exc
        if not int(got):
            raise too_many_streams()
        self._pending.pop(stream_id, None)
        self._held[stream_id] = key_id

    def give(self, key_id: str, stream_id: str) -> None:
        if self._held.pop(stream_id, None) is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self._pending.pop(next(iter(self._pending)))
        self._pending[stream_id] = key_id
        self._wake.set()

    def held_here(self, key_id: str) -> int:
        return sum(1 for k in self._held.values() if k == key_id)

    async def sync(self) -> None:
        """Send the releases waiting, then renew every slot held here (one script per key)."""
        pending, self._pending = self._pending, {}
        try:
            for key_id, ids in _by_key(pending).items():
                await self._release(keys=[rk.stream_quota(key_id), rk.stream_quota_holders(key_id)],
                                    args=[self.gateway, *ids])
            for key_id, ids in _by_key(self._held).items():
                over = await self._renew(keys=[rk.stream_quota(key_id), rk.stream_quota_holders(key_id)],
                                         args=[self.lease_s, self.gateway, self.limit, *ids])
                if int(over):  # they run on (cutting a live stream is worse), uncounted until one ends
                    log.warning("%d stream(s) of key %s lost their slots while Redis was away and find the key's "
                                "cap full: they run on uncounted", int(over), key_id)
        except (RedisError, OSError):
            for sid, key_id in pending.items():  # tried again next round (or they lapse with their leases)
                if sid not in self._held:
                    self._pending.setdefault(sid, key_id)
            raise

    async def run(self) -> None:
        """``sync`` at once on a release, else every third of a lease, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.lease_s / 3)
            self._wake.clear()
            try:
                await self.sync()
            except (RedisError, OSError) as exc:
                log.warning("the stream quota's renewal failed (Redis): %s", exc)
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.sync()
        await self._r.aclose()


def _by_key(streams: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for sid, key_id in streams.items():
        out.setdefault(key_id, []).append(sid)
    return out


