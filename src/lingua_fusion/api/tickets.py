"""Stream tickets: a browser opens a WebSocket with ``?ticket=`` instead of its API key.

A page cannot set headers on a WebSocket, and a key in a URL ends up in proxy logs and browser history. So the page
sends its key in a header to ``POST /v1/stream-tickets`` (api/web.py) and gets a ticket: a random token that stands
for that key, once, for ``TTL_S`` seconds. The WebSocket route redeems it at the handshake (api/ws.py reads
``?ticket=``; ``redeem`` removes it, so a second use is ``unauthenticated``).

Bounds: at most ``MAX_TICKETS`` unredeemed tickets in the server and ``PER_KEY`` per key; past either, ``issue``
returns None (the route answers 429). The book is pure: the clock is passed in.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from ..errors import AuthenticationError

PREFIX = "wst_"  # API keys start with sk_: the two never mix
TTL_S = 60.0
MAX_TICKETS = 1024
PER_KEY = 8


@dataclass(frozen=True)
class Ticket:
    token: str
    key_id: str
    admin: bool
    expires_at: float  # on the clock the book was given


class Tickets(Protocol):
    """What the routes need of a book: this one (one process), api/shared_tickets.py (the workers of one host),
    api/redis_tickets.py (every server on one Redis). Calls may block: the routes run them through ``Offload``."""

    ttl_s: float
    max_tickets: int
    per_key: int

    def issue(self, key_id: str, admin: bool, now: float) -> Ticket | None: ...

    def redeem(self, token: str, now: float) -> Ticket: ...

    def revoke(self, key_id: str) -> int: ...


def is_ticket(secret: str | None) -> bool:
    return bool(secret) and str(secret).startswith(PREFIX)


class TicketBook:
    """Unredeemed tickets, oldest first. ``issue`` and ``redeem`` drop expired tickets as they go."""

    def __init__(self, ttl_s: float = TTL_S, max_tickets: int = MAX_TICKETS, per_key: int = PER_KEY) -> None:
        self.ttl_s, self.max_tickets, self.per_key = ttl_s, max_tickets, per_key
        self._tickets: OrderedDict[str, Ticket] = OrderedDict()  # insertion order = expiry order (fixed TTL)

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, key_id: str, admin: bool, now: float) -> Ticket | None:
        """A new ticket for ``key_id``, or None when the server or that key holds too many unredeemed ones."""
        self._expire(now)
        if len(self._tickets) >= self.max_tickets:
            return None
        if sum(1 for t in self._tickets.values() if t.key_id == key_id) >= self.per_key:
            return None
        ticket = Ticket(PREFIX + secrets.token_urlsafe(24), key_id, admin, now + self.ttl_s)
        self._tickets[ticket.token] = ticket
        return ticket

    def redeem(self, token: str, now: float) -> Ticket:
        """The ticket's key, once: the ticket is gone afterwards. Unknown, used or expired: unauthenticated."""
        self._expire(now)
        ticket = self._tickets.pop(token, None)
        if ticket is None:
            raise AuthenticationError("this stream ticket is unknown, used or expired: get a new one from "
                                      "POST /v1/stream-tickets (each ticket opens one stream, within "
                                      f"{self.ttl_s:g} s)")
        return ticket

    def revoke(self, key_id: str) -> int:
        """Drop a revoked key's tickets; how many there were."""
        gone = [t for t, ticket in self._tickets.items() if ticket.key_id == key_id]
        for t in gone:
            del self._tickets[t]
        return len(gone)

    def _expire(self, now: float) -> None:
        while self._tickets:
            token, ticket = next(iter(self._tickets.items()))
            if ticket.expires_at > now:
                return
            del self._tickets[token]
