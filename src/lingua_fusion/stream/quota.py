"""Open streams per API key (``server.max_streams_per_key``): one process's count, or every gateway's on Redis.

``KeyQuota`` counts in this process's memory (one server; each worker of ``serve --workers`` counts its own).
``RedisKeyQuota`` is chosen when ``state.redis_url`` is set: a key's streams on every server and gateway of that
Redis count against one cap, exactly. A take is one Lua script (``TAKE``: expired leases dropped, the count checked
and the stream added in one step, on Redis's clock), so two gateways cannot both open a key's last stream.

Each stream's slot is a lease (``lease_s``), renewed by the gateway that holds it (``run``, every third of a lease),
so a gateway that dies frees its keys' slots when their leases lapse, not never. A gateway that was away from Redis
past a lease gets its lapsed slots back only within the cap (``RENEW``); streams that find it full run on uncounted
(logged) rather than be cut. A stream resumed on another gateway
keeps its one slot: the slot names its holder (a hash beside the set), the resume's take makes the new gateway the
holder, and the old gateway's release of a slot it no longer holds does nothing. A release is sent by the renewing
loop at once (``give`` wakes it; ``give`` itself is sync, called as a session lets go); a release that cannot reach
Redis lapses with its lease. While Redis is down a take is ``state_store_unavailable`` (as the stream log's failure
is), and streams already open keep their slots: their renewals resume when Redis answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..errors import Overloaded


def too_many_streams() -> Overloaded:
    return Overloaded("this key has too many open streams", retry_after=5.0)


class Quota(Protocol):
    limit: int

    async def take(self, key_id: str, stream_id: str) -> None:
        """A slot of ``key_id``'s cap for ``stream_id``, or ``Overloaded`` (4429) with nothing changed."""
        ...

    def give(self, key_id: str, stream_id: str) -> None:
        """``stream_id``'s slot back."""
        ...

    def held_here(self, key_id: str) -> int:
        """The key's streams this process holds (a cheap early refusal, e.g. of a stream ticket)."""
        ...

    async def run(self) -> None:
        """What keeps the count true while the server serves (the Redis one's lease renewals); returns at once
        when there is nothing to do."""
        ...

    async def close(self) -> None: ...


@dataclass
class KeyQuota:
    """One process's count (shared by the services of one server)."""

    limit: int
    open: dict[str, int] = field(default_factory=dict)

    async def take(self, key_id: str, stream_id: str) -> None:
        if self.open.get(key_id, 0) >= self.limit:
            raise too_many_streams()
        self.open[key_id] = self.open.get(key_id, 0) + 1

    def give(self, key_id: str, stream_id: str) -> None:
        self.open[key_id] = max(0, self.open.get(key_id, 1) - 1)

    def held_here(self, key_id: str) -> int:
        return self.open.get(key_id, 0)

    async def run(self) -> None:
        return None

    async def close(self) -> None:
        return None
