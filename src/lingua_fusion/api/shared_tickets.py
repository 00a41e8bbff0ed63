"""Stream tickets shared by the stream workers of ``serve --workers N`` (api/workers.py).

``TicketBook`` (tickets.py) lives in one process's memory; with several workers the ``POST /v1/stream-tickets``
that issued a ticket and the ``WS /v1/streams?ticket=`` that redeems it land on whichever worker accepts each
connection, so a ticket failed as ``unauthenticated`` whenever the two differed (the live-captions page could not
open a stream). ``SharedTicketBook`` has the same face (``issue``, ``redeem``, ``revoke``, ``len``, the bounds) on
one SQLite file in the supervisor's private run directory, which every worker opens: a ticket issued by any worker
is redeemed once, by any worker. Each check and its write is one ``BEGIN IMMEDIATE`` transaction, so two workers
cannot both redeem a ticket, nor both issue a key's last one. Only a SHA-256 digest of each token is stored. The
clock is passed in as for ``TicketBook`` (``time.monotonic``: one clock for every process of the host).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import AuthenticationError, Overloaded
from ..state.sqlite_tx import write_transaction
from .tickets import MAX_TICKETS, PER_KEY, PREFIX, TTL_S, Ticket

BUSY_S = 2.0  # another worker's transaction is microseconds; this bounds a wedged one


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _busy(exc: sqlite3.OperationalError) -> Overloaded:
    """Locked past BUSY_S: refused, typed, like a full book."""
    return Overloaded("stream tickets are busy; retry shortly", retry_after=1.0)


class SharedTicketBook:
    def __init__(self, path: Path, ttl_s: float = TTL_S, max_tickets: int = MAX_TICKETS,
                 per_key: int = PER_KEY) -> None:
        self.ttl_s, self.max_tickets, self.per_key = ttl_s, max_tickets, per_key
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_S, check_same_thread=False)
        with self._tx():
            self._db.execute("CREATE TABLE IF NOT EXISTS tickets (digest TEXT PRIMARY KEY, key_id TEXT, "
                             "admin INTEGER, expires_at REAL)")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, write_transaction(self._db, busy=_busy) as db:
            yield db

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM tickets").fetchone()[0])

    def issue(self, key_id: str, admin: bool, now: float) -> Ticket | None:
        """A new ticket for ``key_id``, or None when the server or that key holds too many unredeemed ones."""
        with self._tx() as db:
            db.execute("DELETE FROM tickets WHERE expires_at <= ?", (now,))
            (n_all,) = db.execute("SELECT COUNT(*) FROM tickets").fetchone()
            (n_key,) = db.execute("SELECT COUNT(*) FROM tickets WHERE key_id = ?", (key_id,)).fetchone()
            if n_all >= self.max_tickets or n_key >= self.per_key:
                return None
            ticket = Ticket(PREFIX + secrets.token_urlsafe(24), key_id, admin, now + self.ttl_s)
            db.execute("INSERT INTO tickets VALUES (?, ?, ?, ?)",
                       (_digest(ticket.token), key_id, int(admin), ticket.expires_at))
        return ticket

    def redeem(self, token: str, now: float) -> Ticket:
        """The ticket's key, once, whichever worker issued it. Unknown, used or expired: unauthenticated."""
        with self._tx() as db:
            db.execute("DELETE FROM tickets WHERE expires_at <= ?", (now,))
            digest = _digest(token)
            row = db.execute("SELECT key_id, admin, expires_at FROM tickets WHERE digest = ?", (digest,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM tickets WHERE digest = ?", (digest,))
        if row is None:
            raise AuthenticationError("this stream ticket is unknown, used or expired: get a new one from "
                                      "POST /v1/stream-tickets (each ticket opens one stream, within "
                                      f"{self.ttl_s:g} s)")
        return Ticket(token, str(row[0]), bool(row[1]), float(row[2]))

    def revoke(self, key_id: str) -> int:
        """Drop a revoked key's tickets; how many there were."""
        with self._tx() as db:
            return db.execute("DELETE FROM tickets WHERE key_id = ?", (key_id,)).rowcount

    def close(self) -> None:
        self._db.close()
