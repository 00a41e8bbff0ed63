"""Which stores a server's settings select: the keys and glossaries (state/users.py's contract) and the stream log
(state/streams.py's); the implementations import their contract, and this module picks one, so the contracts
import neither."""

from __future__ import annotations

from pathlib import Path

from .streams import SQLiteStreamStore, StreamStore
from .users import UserStore


def open_users(state_dir: Path, redis_url: str | None) -> UserStore:
    """The store ``state.redis_url`` selects: Redis when set (imported only then: redis-py loads the OpenTelemetry
    SDK), else SQLite in ``state_dir``."""
    if redis_url:
        from .redis_users import RedisUserStore

        return RedisUserStore(redis_url)
    from .sqlite import SQLiteStore

    return SQLiteStore(state_dir)


def open_store(state_dir: Path, redis_url: str | None, *, max_log: int = 10_000,
               retention_s: float = 3600.0) -> StreamStore:
    """The stream log ``state.redis_url`` selects: Redis when set, else SQLite in ``state_dir``."""
    if redis_url:
        from .redis_streams import RedisStreamStore

        return RedisStreamStore(redis_url, max_log=max_log, retention_s=int(retention_s))
    return SQLiteStreamStore(state_dir)
