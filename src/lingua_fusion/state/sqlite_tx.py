"""One SQLite write transaction that holds the file's write lock from its first statement.

Several processes share one SQLite file (``serve --workers``: the stream log, the shared ticket book; the model
processes' ledger), so a check and the write it guards are one ``BEGIN IMMEDIATE`` transaction: no other process
writes between them. ``write_transaction`` is that transaction: ``BEGIN IMMEDIATE``, the caller's statements,
``COMMIT``; ``ROLLBACK`` on any exception (re-raised), so the connection is never left mid-transaction.

A file held by another process shows at ``BEGIN IMMEDIATE``: it waits the connection's ``timeout`` for the write
lock, then fails with ``sqlite3.OperationalError`` ("database is locked"). That failure is raised as the caller's
own typed error, ``busy(exc)``, chained from SQLite's (``raise ... from exc``). A failure after it (a statement, the
``COMMIT``) is rolled back and raised as it is: each caller types those as it always has.

``add_column`` is the one schema change the stores make to a file from an earlier release: several processes open
the file at once at start-up, so each may find the column missing and only the first adds it.

The connection must be in autocommit mode (``isolation_level=None``), so that the module does not begin
transactions of its own; the lock that serialises the connection's users is the caller's to hold around this.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def write_transaction(db: sqlite3.Connection,
                      busy: Callable[[sqlite3.OperationalError], Exception]) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` on ``db`` (``busy(exc)`` raised when the write lock cannot be had), the body, ``COMMIT``;
    ``ROLLBACK`` on any exception, which is re-raised."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:  # locked past the connection's timeout: the caller's typed refusal
        raise busy(exc) from exc
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def add_column(db: sqlite3.Connection, table: str, column: str, declaration: str) -> None:
    """Add ``column`` (``declaration``: its type and default) to ``table`` unless it is there, safe against other
    processes adding it at the same moment (the loser's "duplicate column name" is the column being there)."""
    if column in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        return
    try:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    except sqlite3.OperationalError:
        if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
            raise  # not the race: a real failure (a locked or read-only file)
