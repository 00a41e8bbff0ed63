"""One blocking Redis call as the server types its failure: the stores' shared wrapper (state/redis_users.py,
api/redis_tickets.py). Redis unreachable, slow past the client's socket timeout or failing is ``BackendError``
(503 ``backend_unavailable``), never a 500; the next call tries again."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import redis

from ..errors import BackendError

T = TypeVar("T")


def call(fn: Callable[[], T], what: str) -> T:
    """``fn()``; a Redis or socket error raised as ``BackendError`` naming ``what`` failed."""
    try:
        return fn()
    except (redis.RedisError, OSError) as exc:
        raise BackendError(f"{what} failed: {exc}") from exc
