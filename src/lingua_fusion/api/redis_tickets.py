"""Stream tickets on Redis (``state.redis_url`` set): a ticket issued by any server or gateway opens one stream on
any of them, once.

The same face and bounds as ``TicketBook`` (tickets.py): ``issue`` (None past ``max_tickets`` in all or
``per_key`` for the key), ``redeem`` (the ticket's key, once; unknown, used or expired: ``unauthenticated``),
``revoke`` (a revoked key's tickets), ``len``. Only a SHA-256 digest of each token is stored. Each check and its
write is one Lua script on Redis's clock (``ISSUE``: the expired dropped, both bounds checked, the ticket written;
``REDEEM``: read and delete), so two gateways cannot both redeem a ticket nor both issue a key's last one. The
``now`` the callers pass is their own clock's: used only for the returned ``Ticket.expires_at``. Every call blocks
on a round trip: the routes run it through ``Offload`` (state/offload.py); Redis down is a 503.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from typing import TypeVar

import redis

from ..errors import AuthenticationError
from ..state import redis_keys as rk
from ..state.redis_call import call
from .tickets import MAX_TICKETS, PER_KEY, PREFIX, TTL_S, Ticket

T = TypeVar("T")

# KEYS: every ticket, the key's tickets, the ticket; ARGV: ttl_s, max_tickets, per_key, JSON, digest. 1 issued, 0 full
ISSUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) or redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('SET', KEYS[3], ARGV[4], 'PX', math.floor(ttl * 1000))
redis.call('ZADD', KEYS[1], now + ttl, ARGV[5])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[5])
redis.call('EXPIRE', KEYS[2], math.ceil(ttl) + 1)
return 1
"""
# KEYS: the ticket, every ticket; ARGV: digest. The ticket's JSON (now deleted), or nil
REDEEM = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return raw
"""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RedisTicketBook:
    def __init__(self, url: str, ttl_s: float = TTL_S, max_tickets: int = MAX_TICKETS, per_key: int = PER_KEY,
                 *, timeout_s: float = 2.0) -> None:
        self.ttl_s, self.max_tickets, self.per_key = ttl_s, max_tickets, per_key
        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                       decode_responses=True)
        self._issue = self._r.register_script(ISSUE)
        self._redeem = self._r.register_script(REDEEM)

    def _run(self, fn: Callable[[], T]) -> T:
        return call(fn, "the stream tickets (Redis)")

    def __len__(self) -> int:
        return int(self._run(lambda: self._r.zcard(rk.stream_tickets())))

    def issue(self, key_id: str, admin: bool, now: float) -> Ticket | None:
        token = PREFIX + secrets.token_urlsafe(24)
        digest = _digest(token)
        keys = [rk.stream_tickets(), rk.stream_tickets_of_key(key_id), rk.stream_ticket(digest)]
        args: list[str | float | int] = [self.ttl_s, self.max_tickets, self.per_key,
                                         json.dumps({"key_id": key_id, "admin": admin}), digest]
        if not int(self._run(lambda: self._issue(keys=keys, args=args))):
            return None
        return Ticket(token, key_id, admin, now + self.ttl_s)

    def redeem(self, token: str, now: float) -> Ticket:
        digest = _digest(token)
        raw = self._run(lambda: self._redeem(keys=[rk.stream_ticket(digest), rk.stream_tickets()], args=[digest]))
        if not raw:
            raise AuthenticationError("this stream ticket is unknown, used or expired: get a new one from POST "
                                      f"/v1/stream-tickets (each ticket opens one stream, within {self.ttl_s:g} s)")
        got = json.loads(str(raw))
        self._run(lambda: self._r.zrem(rk.stream_tickets_of_key(got["key_id"]), digest))
        return Ticket(token, str(got["key_id"]), bool(got["admin"]), now)

    def revoke(self, key_id: str) -> int:
        def run() -> int:
            mine = rk.stream_tickets_of_key(key_id)
            digests = [str(d) for d in self._r.zrange(mine, 0, -1)]  # type: ignore[union-attr]  # sync client
            if not digests:
                return 0
            pipe = self._r.pipeline(transaction=True)
            pipe.delete(*[rk.stream_ticket(d) for d in digests], mine)
            pipe.zrem(rk.stream_tickets(), *digests)
            deleted = pipe.execute()[0]
            return max(0, int(deleted) - 1)  # the key's own set is one of the keys deleted

        return self._run(run)

    def close(self) -> None:
        self._r.close()
