"""The stream log on Redis (``LINGUAFUSION_STATE__REDIS_URL``): state/streams.py's ``StreamStore`` shared by every
server on that Redis, so another node can resume a stream. The snapshot's rules (``advance``, ``owned``) are
streams.py's, the same as SQLite's."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, TypeVar

from ..errors import BackendError, NotFound
from ..redact import redact_url
from . import redis_keys
from .streams import REPLAY_PAGE, Snapshot, advance, check_token, num, owned, token_digest

if TYPE_CHECKING:
    from redis.client import Pipeline

    from ..json_types import JSONObject

log = logging.getLogger("lingua_fusion.state")
T = TypeVar("T")


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
            owned(snap, epoch)
            if int(num(snap.get("last_seq", 0))) >= int(num(event["seq"])):
                return  # already logged
            advance(snap, event, committed_until, origin, text_until, speakers)
            # compaction: the log keeps the last max_log finals; the snapshot says where it starts
            snap["log_from"] = max(1, int(num(event["seq"])) - self._max_log + 1)
            pipe.multi()
            pipe.rpush(log_key, json.dumps(event, ensure_ascii=False))
            pipe.ltrim(log_key, -self._max_log, -1)
            pipe.expire(log_key, self._ttl)
            pipe.expire(redis_keys.stream_epoch(stream_id), self._ttl)  # lives as long as the snapshot
            pipe.set(key, json.dumps(snap), ex=self._ttl)

        self._watched(stream_id, change)

    def claim(self, stream_id: str, token: str) -> Snapshot:
        def change(pipe: Pipeline, snap: Snapshot | None) -> Snapshot:
            snap = check_token(snap, stream_id, token)
            snap["epoch"] = epoch = int(num(snap.get("epoch", 0))) + 1
            pipe.multi()
            pipe.set(redis_keys.stream_snapshot(stream_id), json.dumps(snap), keepttl=True)
            pipe.set(redis_keys.stream_epoch(stream_id), epoch, ex=self._ttl)
            return snap

        return self._watched(stream_id, change)

    def resume(self, stream_id: str, token: str) -> Snapshot:
        raw = self._run(lambda: self._r.get(redis_keys.stream_snapshot(stream_id)))
        return check_token(json.loads(raw) if raw else None, stream_id, token)

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
            owned(snap, epoch)
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
