"""Admitted streams per API key (and in all), for the model processes that admit them.

One model process (``serve --workers N``): ``KeyCounts``, in its memory. Several (``--model-processes M``: each
worker feeds one of them, each holds its own engine and decides its own capacity): a key's streams land on any of
them, so the per-key cap (``server.max_streams_per_key``) and the server's total (``server.max_streams``) are kept
in ``SharedLedger``, a SQLite file in the supervisor's private run directory that every model process writes: one
row per admitted stream with the process that admitted it. A check and its insert are one ``BEGIN IMMEDIATE``
transaction, so two processes admitting a key's last stream at once cannot both win. A model process that starts
(or starts again after a crash) first deletes the rows of its predecessor at its index; its workers then
re-register their live streams (``force``: counted, never refused). The file lives and dies with the run: nothing
in it outlasts the server.

A file that stays locked past ``BUSY_MS`` (another process wedged mid-transaction) refuses the admission with
``Overloaded`` (a 429 / 4429 with ``retry_after``, as a full server does); a release that cannot be written then is
kept and written by this process's next transaction, so a stream's row never outlives it for good.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...errors import Overloaded
from ...state.sqlite_tx import write_transaction
from ..demand import no_capacity

log = logging.getLogger("lingua_fusion.serving.shard")
Ident = tuple[str, str]  # (engine mode, stream id)
BUSY_MS = 2000  # another process's admission transaction is a few microseconds; this bounds a wedged one


def _key_full() -> Overloaded:
    return Overloaded("this key has too many open streams", retry_after=5.0)


def _server_full(n: int) -> Overloaded:
    return no_capacity("server.max_streams", n)


def _busy(exc: sqlite3.OperationalError) -> Overloaded:
    """Locked past busy_ms: refused, typed, like a full server."""
    log.error("the stream ledger is busy: %s", exc)
    return Overloaded("stream admission is busy; retry shortly", retry_after=1.0)


class Ledger(Protocol):
    def take(self, ident: Ident, key_id: str, force: bool = False) -> None:
        """Count ``ident`` against ``key_id``; raises ``Overloaded`` at the key's (or the server's) cap unless
        ``force`` (a stream admitted before, re-registered)."""
        ...

    def give(self, ident: Ident, key_id: str) -> None: ...


@dataclass
class KeyCounts:
    """Admitted streams per API key, over all workers of the one model process."""

    limit: int
    open: dict[str, int] = field(default_factory=dict)

    def take(self, ident: Ident, key_id: str, force: bool = False) -> None:
        if not force and self.open.get(key_id, 0) >= self.limit:
            raise _key_full()
        self.open[key_id] = self.open.get(key_id, 0) + 1

    def give(self, ident: Ident, key_id: str) -> None:
        self.open[key_id] = max(0, self.open.get(key_id, 1) - 1)


class SharedLedger:
    """The admitted streams of every model process, in one SQLite file (see the module's docstring)."""

    def __init__(self, path: Path, process: int, *, key_limit: int, total_limit: int, busy_ms: int = BUSY_MS) -> None:
        self.process = process
        self.key_limit = key_limit
        self.total_limit = total_limit
        self._lock = threading.Lock()  # one transaction at a time on this connection (a process uses it from its loop)
        self._unwritten: set[Ident] = set()  # releases the locked file refused: deleted by the next transaction
        self._db = sqlite3.connect(str(path), isolation_level=None, timeout=busy_ms / 1000,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")  # the file is the run's scratch: a crash of the host ends it
        self._db.execute("CREATE TABLE IF NOT EXISTS admitted (mode TEXT, stream TEXT, key TEXT, process INTEGER,"
                         " PRIMARY KEY (mode, stream))")
        self._db.execute("CREATE INDEX IF NOT EXISTS by_key ON admitted (key)")
        self._db.execute("DELETE FROM admitted WHERE process = ?", (process,))  # a predecessor's rows

    def take(self, ident: Ident, key_id: str, force: bool = False) -> None:
        with self._lock:
            try:
                with write_transaction(self._db, busy=_busy) as db:  # rolled back on any exception
                    self._admit(db, ident, key_id, force)
            except sqlite3.OperationalError as exc:  # a statement or the COMMIT failed after BEGIN: the same refusal
                raise _busy(exc) from None
            self._unwritten.clear()  # committed with the admission

    def _admit(self, db: sqlite3.Connection, ident: Ident, key_id: str, force: bool) -> None:
        """The check and its insert, in the caller's transaction (with the releases kept for later)."""
        self._write_releases()
        db.execute("DELETE FROM admitted WHERE mode = ? AND stream = ?", ident)  # admitted again: one row
        if not force:
            (n_key,) = db.execute("SELECT COUNT(*) FROM admitted WHERE key = ?", (key_id,)).fetchone()
            if n_key >= self.key_limit:
                raise _key_full()
            (n_all,) = db.execute("SELECT COUNT(*) FROM admitted").fetchone()
            if n_all >= self.total_limit:
                raise _server_full(n_all)
        db.execute("INSERT INTO admitted VALUES (?, ?, ?, ?)", (*ident, key_id, self.process))

    def give(self, ident: Ident, key_id: str) -> None:
        """Never raises (it runs in the model process's read loop): a locked file keeps the release for later."""
        with self._lock:
            self._unwritten.add(ident)
            try:
                self._write_releases()
            except sqlite3.OperationalError as exc:
                log.error("the stream ledger is busy (%s): %d releases kept for later", exc, len(self._unwritten))
                return
            self._unwritten.clear()

    def _write_releases(self) -> None:
        self._db.executemany("DELETE FROM admitted WHERE mode = ? AND stream = ? AND process = ?",
                             [(*ident, self.process) for ident in self._unwritten])

    def count(self, key_id: str | None = None) -> int:
        with self._lock:
            if key_id is None:
                return int(self._db.execute("SELECT COUNT(*) FROM admitted").fetchone()[0])
            return int(self._db.execute("SELECT COUNT(*) FROM admitted WHERE key = ?", (key_id,)).fetchone()[0])

    def close(self) -> None:
        self._db.close()


def drop_process(path: Path, process: int) -> None:
    """Forget the streams model process ``process`` admitted (it died: the supervisor calls this at once, so its
    streams stop counting against their keys before its successor starts; its workers re-register theirs)."""
    db = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_MS / 1000)
    try:
        db.execute("DELETE FROM admitted WHERE process = ?", (process,))
    except sqlite3.OperationalError:
        pass  # no table yet, or locked: the successor deletes them when it starts
    finally:
        db.close()
