"""``Publisher``: this replica's labelled /metrics page in the shared Redis, and every replica's read back merged
(metrics_view.py says what and why). Imported only when ``state.redis_url`` is set."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from .errors import BackendError
from .metrics_view import ParsedRegistry, merge
from .state import redis_keys as rk

log = logging.getLogger("lingua_fusion.metrics")
MAX_REPLICAS = 256  # pages read for one cluster view


class Publisher:
    def __init__(self, url: str, replica: str, render: Callable[[], bytes], *, interval_s: float = 5.0,
                 timeout_s: float = 2.0) -> None:
        self.replica = replica
        self.interval_s = interval_s
        self._render = render  # this replica's labelled page
        self._r = aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def publish(self) -> None:
        page = await asyncio.to_thread(self._render)  # a registry's collect takes the GIL a while: not on the loop
        ttl = max(1, int(self.interval_s * 3))
        pipe = self._r.pipeline(transaction=True)
        pipe.set(rk.replica_metrics(self.replica), page, ex=ttl)
        pipe.zadd(rk.replica_metrics_index(), {self.replica: time.time() + ttl})  # the view reads the index, no SCAN
        await pipe.execute()

    async def view(self) -> bytes:
        """Every live replica's page, merged (this one's included once it has published). BackendError when a
        page cannot be read as Prometheus text."""
        index = rk.replica_metrics_index()
        now = time.time()
        await self._r.zremrangebyscore(index, "-inf", now)
        replicas = await self._r.zrangebyscore(index, now, "+inf", start=0, num=MAX_REPLICAS)
        got = await self._r.mget([rk.replica_metrics(r.decode() if isinstance(r, bytes) else str(r))
                                  for r in replicas]) if replicas else []
        pages = [p if isinstance(p, bytes) else str(p).encode("utf-8") for p in got if p]
        return await asyncio.to_thread(merge, pages)  # hundreds of pages: not on the loop

    async def snapshot_registry(self) -> ParsedRegistry:
        """The merged view as a registry (the operations page's digest), parsed off the loop."""
        page = await self.view()
        try:
            return await asyncio.to_thread(ParsedRegistry, page)
        except ValueError as exc:  # a replica's page that is not Prometheus text
            raise BackendError(f"a replica's metrics page could not be parsed: {exc}") from exc

    async def run(self) -> None:
        """``publish`` every ``interval_s`` until cancelled; a failure is logged and tried again next time."""
        while True:
            try:
                await self.publish()
            except (RedisError, OSError) as exc:
                log.warning("publishing this replica's metrics to Redis failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        """The page is left to expire (within three intervals): the workers of one server share it."""
        await self._r.aclose()
