"""The shared tier on Redis: entries every server sharing the Redis reads, each expiring after ``ttl_s``.

Called from model threads and REST workers, never from the event loop. A failing Redis is skipped for a backoff
(1 s doubling to 30 s) rather than costing every segment a timeout: the memory then works from its local tier.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TypedDict

from ..redact import redact_url
from ..state import redis_keys

log = logging.getLogger("lingua_fusion.tm")


class SharedEntry(TypedDict):
    """One entry as JSON in Redis: the translation and the glossary sources it applied."""
    t: str
    a: list[str]


class SharedTier:
    def __init__(self, url: str, ttl_s: int, *, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import redis

        self._r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                       decode_responses=True)
        self._url = redact_url(url)
        self._errors = (redis.RedisError, OSError)
        self.ttl_s = ttl_s
        self.clock = clock
        self.failures = 0
        self._down_until = 0.0
        self._lock = threading.Lock()

    def available(self) -> bool:
        return self.clock() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            self._down_until = self.clock() + min(30.0, 2.0 ** min(self.failures - 1, 5))
        if self.failures == 1:
            log.warning("translation memory: Redis at %s failed (%s); using the local tier", self._url, exc)

    def get_many(self, keys: list[str]) -> list[SharedEntry | None]:
        if not keys or not self.available():
            return [None] * len(keys)
        try:
            raws = self._r.mget([redis_keys.tm_entry(k) for k in keys])
        except self._errors as exc:
            self._failed(exc)
            return [None] * len(keys)
        self.failures = 0
        return [json.loads(r) if r else None for r in raws]

    def put_many(self, entries: dict[str, SharedEntry]) -> None:
        if not entries or not self.available():
            return
        try:
            pipe = self._r.pipeline(transaction=False)
            for k, v in entries.items():
                pipe.set(redis_keys.tm_entry(k), json.dumps(v, ensure_ascii=False), ex=self.ttl_s)
            pipe.execute()
        except self._errors as exc:
            self._failed(exc)

    def close(self) -> None:
        self._r.close()
