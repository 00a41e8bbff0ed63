"""Which key and glossary store a server's settings select (the implementations import state/users.py's
contract; this module picks one, so the contract imports neither)."""

from __future__ import annotations

from pathlib import Path

from .users import UserStore


def open_users(state_dir: Path, redis_url: str | None) -> UserStore:
    """The store ``state.redis_url`` selects: Redis when set (imported only then: redis-py loads the OpenTelemetry
    SDK), else SQLite in ``state_dir``."""
    if redis_url:
        from .redis_users import RedisUserStore

        return RedisUserStore(redis_url)
    from .sqlite import SQLiteStore

    return SQLiteStore(state_dir)
