"""Crash-safe stream state: a write-ahead log of committed finals plus a snapshot per stream.

One interface, two stores (SQLite, the embedded default; Redis for shared state). A final is appended to the log
*before* it is sent; the snapshot records what a restarted server needs to continue the stream: its spec, the digest
of its resume token, the last sequence number logged, and ``committed_until`` (stream time up to which audio is
covered by logged finals: a resuming client re-sends audio from there).

Ownership is in the snapshot too: ``epoch`` counts the resumes. A resume ``claim``s the stream (the epoch goes up,
atomically, in the store that every worker process and server shares); a session writes with the epoch it got, and
a write from an older epoch is refused with ``TakenOver``: a session whose stream was resumed elsewhere stops
writing, and no two sessions log finals under the same seq.

What can be lost (see docs/reliability.md): SQLite runs in WAL mode with synchronous=NORMAL, so a killed *process*
loses nothing that was logged (the OS has it); a power loss can lose the last transactions. Redis with
``appendonly yes`` and ``appendfsync everysec`` can lose up to about one second of writes if Redis itself dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from ..errors import AuthenticationError, BackendError, ClientError, NotFound, TakenOver
from .private import private_dir, private_file
from .sqlite_tx import add_column, write_transaction

if TYPE_CHECKING:

    from ..json_types import JSONObject

log = logging.getLogger("lingua_fusion.state")
T = TypeVar("T")

# A stream's snapshot: what the caller opened it with ({"spec": ...}) and the store's own fields (token_digest,
# last_seq, committed_until, text_until, origin, closed, epoch, log_from, speakers), as JSON. Read back from the
# store it is whatever was stored: each field is narrowed where it is read.
Snapshot: TypeAlias = dict[str, object]


def num(value: object) -> int | float | str:
    """A stored number for ``int()``/``float()`` (anything else is the TypeError ``int()`` would raise)."""
    if isinstance(value, (int, float, str)):
        return value
    raise TypeError(f"not a number: {value!r}")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


EPOCH_BATCH = 500  # stream ids per query of ``epochs`` (SQLite's bound on host parameters is far above)
REPLAY_PAGE = 256  # finals read per Redis call of a resume's replay, from the log's end back


class StreamStore(Protocol):
    def open_stream(self, stream_id: str, token: str, snapshot: Mapping[str, object]) -> None: ...

    def append_final(self, stream_id: str, event: Mapping[str, object], committed_until: float | None,
                     origin: float | None = None, text_until: float | None = None,
                     epoch: int | None = None, speakers: Mapping[str, object] | None = None) -> None:
        """Log ``event`` (a seq already logged is a retry: nothing happens). ``epoch``: the writing session's; a
        stream claimed since is not written (``TakenOver``). None: no owner check (tools, tests). ``speakers``: a
        diarize stream's speakers after it, kept in the snapshot (None: left as they were)."""
        ...

    def resume(self, stream_id: str, token: str) -> Snapshot:
        """The snapshot (token checked), read only."""
        ...

    def claim(self, stream_id: str, token: str) -> Snapshot:
        """A resume takes the stream over: the token checked, the epoch raised by one in the same transaction; the
        snapshot returned carries the new ``epoch``, which the resumed session writes with."""
        ...

    def finals_after(self, stream_id: str, seq: int) -> list[JSONObject]: ...

    def epochs(self, stream_ids: Collection[str]) -> dict[str, int]:
        """Each stream's owner epoch now (one small read for all, not the snapshots; a stream not in the store, or
        never resumed, may be left out: nothing to end): a live session whose epoch is lower was taken over by a
        resume elsewhere."""
        ...

    def close_stream(self, stream_id: str, epoch: int | None = None) -> None: ...

    def compact(self, retention_s: float, max_log: int, live: Collection[str] = ()) -> dict[str, int]:
        """Drop what no client can still ask for: streams closed (or left, no session serving them) for
        ``retention_s``; a live stream's log beyond its last ``max_log`` finals (its snapshot's ``log_from`` says
        where it starts now, and a resume from before it is told ``log_compacted``). ``live``: streams a session of
        the caller serves; they are kept however long they were silent (a pause is not an end), and their clock
        is refreshed so another process's compaction keeps them too."""
        ...

    def close(self) -> None: ...


def advance(snap: Snapshot, event: Mapping[str, object], committed_until: float | None, origin: float | None,
             text_until: float | None, speakers: Mapping[str, object] | None = None) -> None:
    """The snapshot after logging ``event``: ``committed_until`` (stream time covered by audio finals: the client
    re-sends audio after it), ``text_until`` (the latest logged text: re-sent text up to it is dropped) and a
    diarize stream's ``speakers`` (its clusterer's centroids and names, stream/speakers.py: a few KB at most)."""
    snap["last_seq"] = int(num(event["seq"]))
    if speakers is not None:
        snap["speakers"] = speakers
    if committed_until is not None:
        snap["committed_until"] = max(float(num(snap.get("committed_until", 0.0))), committed_until)
    if text_until is not None:
        snap["text_until"] = max(float(num(snap.get("text_until", -1.0))), text_until)
    if origin is not None:
        snap["origin"] = origin


def owned(snap: Snapshot, epoch: int | None) -> None:
    """A session writes only while it holds the stream's current epoch (nobody resumed the stream since)."""
    if epoch is not None and int(num(snap.get("epoch", 0))) != epoch:
        raise TakenOver("this stream was resumed by another connection; this one is closed")


def write_failed(exc: Exception) -> BackendError:
    return BackendError(f"stream log write failed: {exc}")


def compaction_failed(exc: Exception) -> BackendError:
    return BackendError(f"stream log compaction failed: {exc}")


def check_token(snapshot: Snapshot | None, stream_id: str, token: str) -> Snapshot:
    if snapshot is None:
        raise NotFound(f"no stream {stream_id} to resume")
    if snapshot.get("token_digest") != token_digest(token):
        raise AuthenticationError("wrong resume token for this stream")
    return snapshot


class SQLiteStreamStore:
    def __init__(self, state_dir: Path) -> None:
        path = private_file(private_dir(state_dir) / "streams.sqlite3")
        self._db = sqlite3.connect(path, check_same_thread=False, timeout=10,
                                   isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS stream_snapshot (stream_id TEXT PRIMARY KEY, body TEXT, "
                             "updated REAL)")
            self._db.execute("CREATE TABLE IF NOT EXISTS stream_log (stream_id TEXT, seq INTEGER, body TEXT, "
                             "PRIMARY KEY (stream_id, seq))")
            # the owner epoch beside the body, so the take-over watch reads it without parsing whole snapshots
            # (a glossary of 5,000 terms is in the body); a file from before it gets the column (0: never resumed)
            add_column(self._db, "stream_snapshot", "epoch", "INTEGER NOT NULL DEFAULT 0")

    def open_stream(self, stream_id: str, token: str, snapshot: Mapping[str, object]) -> None:
        body = {**snapshot, "token_digest": token_digest(token), "last_seq": 0, "committed_until": 0.0,
                "closed": False, "epoch": 0}
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO stream_snapshot (stream_id, body, updated, epoch) "
                             "VALUES (?,?,?,0)", (stream_id, json.dumps(body), time.time()))

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding the file's write lock from its first read (BEGIN IMMEDIATE): a check and the
        write it guards are not split by another process sharing the file (``serve --workers``)."""
        with self._lock:
            try:
                with write_transaction(self._db, busy=write_failed) as db:  # rolled back on any exception
                    yield db
            except (ClientError, BackendError):  # the store's answer (not found, ...), or the file locked: as is
                raise
            except Exception as exc:  # anything else (an overflowing seq too, a failed COMMIT)
                raise write_failed(exc) from exc

    @staticmethod
    def _read(db: sqlite3.Connection, stream_id: str) -> Snapshot | None:
        row = db.execute("SELECT body FROM stream_snapshot WHERE stream_id=?", (stream_id,)).fetchone()
        return json.loads(row[0]) if row else None

    @staticmethod
    def _put(db: sqlite3.Connection, stream_id: str, snap: Snapshot) -> None:
        db.execute("UPDATE stream_snapshot SET body=?, updated=?, epoch=? WHERE stream_id=?",
                   (json.dumps(snap), time.time(), int(num(snap.get("epoch", 0))), stream_id))

    def append_final(self, stream_id: str, event: Mapping[str, object], committed_until: float | None,
                     origin: float | None = None, text_until: float | None = None,
                     epoch: int | None = None, speakers: Mapping[str, object] | None = None) -> None:
        with self._write() as db:
            snap = self._read(db, stream_id)
            if snap is None:
                raise NotFound(f"no stream {stream_id}")
            owned(snap, epoch)
            if int(num(snap.get("last_seq", 0))) >= int(num(event["seq"])):
                return  # already logged (a retried write whose first try got through)
            advance(snap, event, committed_until, origin, text_until, speakers)
            db.execute("INSERT INTO stream_log VALUES (?,?,?)",
                       (stream_id, int(num(event["seq"])), json.dumps(event, ensure_ascii=False)))
            self._put(db, stream_id, snap)

    def claim(self, stream_id: str, token: str) -> Snapshot:
        with self._write() as db:
            snap = check_token(self._read(db, stream_id), stream_id, token)
            snap["epoch"] = int(num(snap.get("epoch", 0))) + 1
            self._put(db, stream_id, snap)
        return snap

    def _snapshot(self, stream_id: str) -> Snapshot | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM stream_snapshot WHERE stream_id=?", (stream_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def resume(self, stream_id: str, token: str) -> Snapshot:
        return check_token(self._snapshot(stream_id), stream_id, token)

    def finals_after(self, stream_id: str, seq: int) -> list[JSONObject]:
        with self._lock:
            rows = self._db.execute("SELECT body FROM stream_log WHERE stream_id=? AND seq>? ORDER BY seq",
                                    (stream_id, seq)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def epochs(self, stream_ids: Collection[str]) -> dict[str, int]:
        ids, out = list(stream_ids), {}
        for i in range(0, len(ids), EPOCH_BATCH):
            chunk = ids[i: i + EPOCH_BATCH]
            with self._lock:
                rows = self._db.execute("SELECT stream_id, epoch FROM stream_snapshot "
                                        f"WHERE stream_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            out.update({sid: int(epoch) for sid, epoch in rows})
        return out

    def close_stream(self, stream_id: str, epoch: int | None = None) -> None:
        with self._write() as db:
            snap = self._read(db, stream_id)
            if snap is not None:
                owned(snap, epoch)
                snap["closed"] = True
                self._put(db, stream_id, snap)

    def compact(self, retention_s: float, max_log: int, live: Collection[str] = ()) -> dict[str, int]:
        """The Protocol's; then the WAL file is checkpointed back to zero length. A stream silent for
        ``retention_s`` whose session is live (a conference's lunch break: audio, no finals) was dropped here
        before, and its next final found no stream (``the stream log lost this stream``)."""
        cutoff = time.time() - retention_s
        with self._lock:
            trimmed = 0
            try:
                # the write lock before the choice (serve --workers: another process may resume a silent stream,
                # refreshing its `updated`, between a choice made outside and the delete: its log was dropped)
                with write_transaction(self._db, busy=compaction_failed) as db:
                    self._touch(db, list(live))
                    old = [r[0] for r in db.execute("SELECT stream_id FROM stream_snapshot WHERE updated < ?",
                                                    (cutoff,)).fetchall()]
                    for sid in old:
                        db.execute("DELETE FROM stream_log WHERE stream_id=?", (sid,))
                        db.execute("DELETE FROM stream_snapshot WHERE stream_id=?", (sid,))
                    long = db.execute("SELECT stream_id, MAX(seq), COUNT(*) FROM stream_log GROUP BY stream_id "
                                      "HAVING COUNT(*) > ?", (max_log,)).fetchall()
                    for sid, last, _n in long:
                        trimmed += db.execute("DELETE FROM stream_log WHERE stream_id=? AND seq <= ?",
                                              (sid, last - max_log)).rowcount
                        row = db.execute("SELECT body FROM stream_snapshot WHERE stream_id=?", (sid,)).fetchone()
                        if row is not None:
                            snap = json.loads(row[0])
                            snap["log_from"] = last - max_log + 1
                            db.execute("UPDATE stream_snapshot SET body=? WHERE stream_id=?", (json.dumps(snap), sid))
            except BackendError:  # the file locked: compaction_failed's
                raise
            except Exception as exc:  # rolled back (write_transaction)
                raise compaction_failed(exc) from exc
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"streams_dropped": len(old), "finals_trimmed": trimmed}

    @staticmethod
    def _touch(db: sqlite3.Connection, stream_ids: list[str]) -> None:
        """Live streams' snapshots are as fresh as now (retention counts from the end of a session, not from its
        last final)."""
        now = time.time()
        for i in range(0, len(stream_ids), EPOCH_BATCH):
            chunk = stream_ids[i: i + EPOCH_BATCH]
            db.execute(f"UPDATE stream_snapshot SET updated=? WHERE stream_id IN ({','.join('?' * len(chunk))})",
                       (now, *chunk))

    def close(self) -> None:
        with self._lock:
            self._db.close()
