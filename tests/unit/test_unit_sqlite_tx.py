"""state/sqlite_tx.py: one BEGIN IMMEDIATE transaction, committed on success, rolled back on any exception, and a
file held by another process refused with the caller's own typed error (the stream log, the shared ticket book and
the model processes' ledger all write through it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from lingua_fusion.errors import BackendError, Overloaded
from lingua_fusion.state.sqlite_tx import write_transaction


class Busy(Exception):
    """The caller's typed refusal."""


def _busy(exc: sqlite3.OperationalError) -> Busy:
    return Busy(f"the file is busy: {exc}")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    p = tmp_path / "tx.db"
    db = sqlite3.connect(str(p), isolation_level=None)
    db.execute("CREATE TABLE t (v INTEGER)")
    db.close()
    return p


@pytest.fixture
def db(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=0.05)
    yield conn
    conn.close()


def _rows(path: Path) -> list[int]:
    """What another process sees in the file."""
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        return [r[0] for r in other.execute("SELECT v FROM t ORDER BY v")]
    finally:
        other.close()


def test_the_body_is_committed_when_it_ends(path: Path, db: sqlite3.Connection) -> None:
    with write_transaction(db, busy=_busy) as tx:
        assert tx is db and db.in_transaction
        tx.execute("INSERT INTO t VALUES (1)")
        tx.execute("INSERT INTO t VALUES (2)")
    assert not db.in_transaction
    assert _rows(path) == [1, 2]


@pytest.mark.parametrize("error", [ValueError("a check failed"), KeyboardInterrupt()])
def test_any_exception_rolls_the_body_back_and_is_raised_as_it_is(path: Path, db: sqlite3.Connection,
                                                                   error: BaseException) -> None:
    with pytest.raises(type(error)) as raised, write_transaction(db, busy=_busy) as tx:
        tx.execute("INSERT INTO t VALUES (1)")
        raise error
    assert raised.value is error  # not typed as busy: only a locked file is
    assert not db.in_transaction and _rows(path) == []
    with write_transaction(db, busy=_busy) as tx:  # the connection is not left mid-transaction
        tx.execute("INSERT INTO t VALUES (3)")
    assert _rows(path) == [3]


def test_a_file_held_by_another_process_is_the_callers_typed_error(path: Path, db: sqlite3.Connection) -> None:
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process, wedged mid-transaction
        ran = False
        with pytest.raises(Busy) as refused, write_transaction(db, busy=_busy):
            ran = True
        assert not ran and not db.in_transaction
        assert isinstance(refused.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(refused.value)
        other.execute("ROLLBACK")
    finally:
        other.close()
    with write_transaction(db, busy=_busy) as tx:  # the file free again: the next transaction goes through
        tx.execute("INSERT INTO t VALUES (4)")
    assert _rows(path) == [4]


def _hold(path: Path) -> sqlite3.Connection:
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_the_shared_ticket_book_refuses_on_a_locked_file_as_overloaded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from lingua_fusion.api import shared_tickets

    monkeypatch.setattr(shared_tickets, "BUSY_S", 0.05)
    path = tmp_path / "tickets.db"
    book = shared_tickets.SharedTicketBook(path)
    other = _hold(path)
    try:
        with pytest.raises(Overloaded) as refused:
            book.issue("k", admin=False, now=0.0)
        assert (refused.value.message, refused.value.retry_after) == ("stream tickets are busy; retry shortly", 1.0)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert book.issue("k", admin=False, now=0.0) is not None
    book.close()


def test_the_stream_log_refuses_on_a_locked_file_as_a_backend_error(tmp_path: Path) -> None:
    from lingua_fusion.state.streams import SQLiteStreamStore

    store = SQLiteStreamStore(tmp_path)
    store._db.execute("PRAGMA busy_timeout = 50")  # 10 s in production
    store.open_stream("s1", "tok", {"spec": {}})
    other = _hold(next(tmp_path.rglob("streams.sqlite3")))
    try:
        with pytest.raises(BackendError) as refused:
            store.claim("s1", "tok")
        assert refused.value.message == "stream log write failed: database is locked"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.claim("s1", "tok")["epoch"] == 1
    store.close()
