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
import functools
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from ..errors import AuthenticationError, BackendError, ClientError, NotFound, TakenOver
from ..redact import redact_url
from . import redis_keys
from .private import private_dir, private_file
from .sqlite_tx import add_column, write_transaction

if TYPE_CHECKING:
    from redis.client import Pipeline

    from ..json_types import JSONObject

log = logging.getLogger("lingua_fusion.state")
T = TypeVar("T")

# A stream's snapshot: what the caller opened it with ({"spec": ...}) and the store's own fields (token_digest,
# last_seq, committed_until, text_until, origin, closed, epoch, log_from, speakers), as JSON. Read back from the
# store it is whatever was stored: each field is narrowed where it is read.
Snapshot: TypeAlias = dict[str, object]


def _num(value: object) -> int | float | str:
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


def _advance(snap: Snapshot, event: Mapping[str, object], committed_until: float | None, origin: float | None,
             text_until: float | None, speakers: Mapping[str, object] | None = None) -> None:
    """The snapshot after logging ``event``: ``committed_until`` (stream time covered by audio finals: the client
    re-sends audio after it), ``text_until`` (the latest logged text: re-sent text up to it is dropped) and a
    diarize stream's ``speakers`` (its clusterer's centroids and names, stream/speakers.py: a few KB at most)."""
    snap["last_seq"] = int(_num(event["seq"]))
    if speakers is not None:
        snap["speakers"] = speakers
    if committed_until is not None:
        snap["committed_until"] = max(float(_num(snap.get("committed_until", 0.0))), committed_until)
    if text_until is not None:
        snap["text_until"] = max(float(_num(snap.get("text_until", -1.0))), text_until)
    if origin is not None:
        snap["origin"] = origin


def _owned(snap: Snapshot, epoch: int | None) -> None:
    """A session writes only while it holds the stream's current epoch (nobody resumed the stream since)."""
    if epoch is not None and int(_num(snap.get("epoch", 0))) != epoch:
        raise TakenOver("this stream was resumed by another connection; this one is closed")


def _write_failed(exc: Exception) -> BackendError:
    return BackendError(f"stream log write failed: {exc}")


def _compaction_failed(exc: Exception) -> BackendError:
    return BackendError(f"stream log compaction failed: {exc}")


def _check(snapshot: Snapshot | None, stream_id: str, token: str) -> Snapshot:
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
                with write_transaction(self._db, busy=_write_failed) as db:  # rolled back on any exception
                    yield db
            except (ClientError, BackendError):  # the store's answer (not found, ...), or the file locked: as is
                raise
            except Exception as exc:  # anything else (an overflowing seq too, a failed COMMIT)
                raise _write_failed(exc) from exc

    @staticmethod
    def _read(db: sqlite3.Connection, stream_id: str) -> Snapshot | None:
        row = db.execute("SELECT body FROM stream_snapshot WHERE stream_id=?", (stream_id,)).fetchone()
        return json.loads(row[0]) if row else None

    @staticmethod
    def _put(db: sqlite3.Connection, stream_id: str, snap: Snapshot) -> None:
        db.execute("UPDATE stream_snapshot SET body=?, updated=?, epoch=? WHERE stream_id=?",
                   (json.dumps(snap), time.time(), int(_num(snap.get("epoch", 0))), stream_id))

    def append_final(self, stream_id: str, event: Mapping[str, object], committed_until: float | None,
                     origin: float | None = None, text_until: float | None = None,
                     epoch: int | None = None, speakers: Mapping[str, object] | None = None) -> None:
        with self._write() as db:
            snap = self._read(db, stream_id)
            if snap is None:
                raise NotFound(f"no stream {stream_id}")
            _owned(snap, epoch)
            if int(_num(snap.get("last_seq", 0))) >= int(_num(event["seq"])):
                return  # already logged (a retried write whose first try got through)
            _advance(snap, event, committed_until, origin, text_until, speakers)
            db.execute("INSERT INTO stream_log VALUES (?,?,?)",
                       (stream_id, int(_num(event["seq"])), json.dumps(event, ensure_ascii=False)))
            self._put(db, stream_id, snap)

    def claim(self, stream_id: str, token: str) -> Snapshot:
        with self._write() as db:
            snap = _check(self._read(db, stream_id), stream_id, token)
            snap["epoch"] = int(_num(snap.get("epoch", 0))) + 1
            self._put(db, stream_id, snap)
        return snap

    def _snapshot(self, stream_id: str) -> Snapshot | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM stream_snapshot WHERE stream_id=?", (stream_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def resume(self, stream_id: str, token: str) -> Snapshot:
        return _check(self._snapshot(stream_id), stream_id, token)

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
                _owned(snap, epoch)
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
                with write_transaction(self._db, busy=_compaction_failed) as db:
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
            except BackendError:  # the file locked: _compaction_failed's
                raise
            except Exception as exc:  # rolled back (write_transaction)
                raise _compaction_failed(exc) from exc
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


class RedisStreamStore:
    """The same store on Redis (``LINGUAFUSION_STATE__REDIS_URL``), so another node can resume a stream."""

    def __init__(self, url: str, *, ttl_s: int = 24 * 3600, timeout_s: float = 2.0, max_log: int = 10_000,
                 retention_s: int = 3600) -> None:
        import redis

        # short socket timeouts: a stalled or cut-off Redis fails a call in seconds (the caller backs off and keeps
        # the finals in a backlog) instead of holding a stream for the library's default of forever
        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                       decode_responses=True)
        self._ttl = ttl_s  # a stream silent this long expires (Redis drops it)
        self._max_log = max_log
        self._retention = retention_s  # a closed stream is kept this long (late resumes, transcript fetches)
        self._errors = (redis.RedisError, OSError)
        self._watch_error = redis.WatchError
        try:
            self._r.ping()
        except redis.RedisError as exc:  # not fatal: streams are refused (503) until it answers
            log.warning("Redis at %s does not answer yet: %s", redact_url(url), exc)

    def _run(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._errors as exc:
            raise BackendError(f"Redis failed: {exc}") from exc

    def open_stream(self, stream_id: str, token: str, snapshot: Mapping[str, object]) -> None:
        body = {**snapshot, "token_digest": token_digest(token), "last_seq": 0, "committed_until": 0.0,
                "closed": False, "epoch": 0}
        key = redis_keys.stream_snapshot(stream_id)

        def run() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.delete(redis_keys.stream_log(stream_id), redis_keys.stream_epoch(stream_id))
            pipe.set(key, json.dumps(body), ex=self._ttl)
            pipe.execute()

        self._run(run)

    def _watched(self, stream_id: str, change: Callable[[Pipeline, Snapshot | None], T]) -> T:
        """``change(pipe, snapshot)`` with the snapshot WATCHed: it checks what it read and queues its writes
        after ``pipe.multi()`` (or none); when anyone changed the snapshot in between (a retried write racing its
        first try, a resume on another process), nothing is written and it runs again on the new snapshot."""
        key = redis_keys.stream_snapshot(stream_id)

        def run() -> T:
            for _ in range(5):
                with self._r.pipeline(transaction=True) as pipe:
                    try:
                        pipe.watch(key)
                        raw = pipe.get(key)
                        out = change(pipe, json.loads(raw) if raw else None)
                        if pipe.explicit_transaction:  # change queued writes
                            pipe.execute()
                        return out
                    except self._watch_error:
                        continue
            raise BackendError(f"stream {stream_id}: the snapshot kept changing under the write")

        return self._run(run)

    def append_final(self, stream_id: str, event: Mapping[str, object], committed_until: float | None,
                     origin: float | None = None, text_until: float | None = None,
                     epoch: int | None = None, speakers: Mapping[str, object] | None = None) -> None:
        key, log_key = redis_keys.stream_snapshot(stream_id), redis_keys.stream_log(stream_id)

        def change(pipe: Pipeline, snap: Snapshot | None) -> None:
            if snap is None:
                raise NotFound(f"no stream {stream_id}")
            _owned(snap, epoch)
            if int(_num(snap.get("last_seq", 0))) >= int(_num(event["seq"])):
                return  # already logged
            _advance(snap, event, committed_until, origin, text_until, speakers)
            # compaction: the log keeps the last max_log finals; the snapshot says where it starts
            snap["log_from"] = max(1, int(_num(event["seq"])) - self._max_log + 1)
            pipe.multi()
            pipe.rpush(log_key, json.dumps(event, ensure_ascii=False))
            pipe.ltrim(log_key, -self._max_log, -1)
            pipe.expire(log_key, self._ttl)
            pipe.expire(redis_keys.stream_epoch(stream_id), self._ttl)  # lives as long as the snapshot
            pipe.set(key, json.dumps(snap), ex=self._ttl)

        self._watched(stream_id, change)

    def claim(self, stream_id: str, token: str) -> Snapshot:
        def change(pipe: Pipeline, snap: Snapshot | None) -> Snapshot:
            snap = _check(snap, stream_id, token)
            snap["epoch"] = epoch = int(_num(snap.get("epoch", 0))) + 1
            pipe.multi()
            pipe.set(redis_keys.stream_snapshot(stream_id), json.dumps(snap), keepttl=True)
            pipe.set(redis_keys.stream_epoch(stream_id), epoch, ex=self._ttl)
            return snap

        return self._watched(stream_id, change)

    def resume(self, stream_id: str, token: str) -> Snapshot:
        raw = self._run(lambda: self._r.get(redis_keys.stream_snapshot(stream_id)))
        return _check(json.loads(raw) if raw else None, stream_id, token)

    def epochs(self, stream_ids: Collection[str]) -> dict[str, int]:
        ids = list(stream_ids)
        if not ids:
            return {}
        # the epoch keys alone (a claim writes one), not the snapshots: a stream never resumed has none (left out:
        # nothing to end); the watch asks every second for every live stream, and a snapshot carries its glossary
        raws = self._run(lambda: self._r.mget([redis_keys.stream_epoch(sid) for sid in ids]))
        return {sid: int(raw) for sid, raw in zip(ids, raws, strict=True) if raw is not None}

    def finals_after(self, stream_id: str, seq: int) -> list[JSONObject]:
        """Read from the log's end back, a page at a time, until a final at or before ``seq``: a resume late in a
        long stream reads what it asks for, not the whole log (10,000 finals of JSON, on every reconnect)."""
        key = redis_keys.stream_log(stream_id)
        found: dict[int, JSONObject] = {}
        for end in range(-1, -self._max_log - REPLAY_PAGE, -REPLAY_PAGE):
            page = self._run(functools.partial(self._r.lrange, key, end - REPLAY_PAGE + 1, end))
            entries = [json.loads(r) for r in page]  # oldest first
            # by seq: a final appended between two reads shifts the pages by one (read twice, never skipped)
            found.update({int(e["seq"]): e for e in entries if int(e["seq"]) > seq})
            if len(page) < REPLAY_PAGE or int(entries[0]["seq"]) <= seq:
                break  # the log's start, or the client has everything before this page
        return [found[k] for k in sorted(found)]

    def close_stream(self, stream_id: str, epoch: int | None = None) -> None:
        def change(pipe: Pipeline, snap: Snapshot | None) -> None:
            if snap is None:
                return
            _owned(snap, epoch)
            snap["closed"] = True
            pipe.multi()
            pipe.set(redis_keys.stream_snapshot(stream_id), json.dumps(snap), ex=self._retention)
            pipe.expire(redis_keys.stream_log(stream_id), self._retention)
            pipe.expire(redis_keys.stream_epoch(stream_id), self._retention)

        self._watched(stream_id, change)

    def compact(self, retention_s: float, max_log: int, live: Collection[str] = ()) -> dict[str, int]:
        """Nothing to sweep: Redis expires closed streams after the retention and silent ones after the TTL, and
        every append trims the log to its last ``max_log`` finals. A live stream's keys get their TTL again, so a
        session silent longer than the TTL keeps its stream."""
        ids = list(live)

        def run() -> None:
            pipe = self._r.pipeline(transaction=False)
            for sid in ids:  # EXPIRE on a key that is not there does nothing
                for key in (redis_keys.stream_snapshot(sid), redis_keys.stream_log(sid), redis_keys.stream_epoch(sid)):
                    pipe.expire(key, self._ttl)
            pipe.execute()

        if ids:
            self._run(run)
        return {"streams_dropped": 0, "finals_trimmed": 0}

    def close(self) -> None:
        self._r.close()


def open_store(state_dir: Path, redis_url: str | None, *, max_log: int = 10_000,
               retention_s: float = 3600.0) -> StreamStore:
    if redis_url:
        return RedisStreamStore(redis_url, max_log=max_log, retention_s=int(retention_s))
    return SQLiteStreamStore(state_dir)
