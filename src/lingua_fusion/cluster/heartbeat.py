"""Gateways' heartbeats in Redis: who is alive, which streams each holds, how many streams the cluster admitted.

Each gateway writes one key (state/redis_keys.py ``cluster_gateway``) every ``interval_s`` with a TTL of
``ttl_s``, so a killed gateway drops out within ``ttl_s`` without anyone cleaning up. Reading every live key gives
the streams admitted cluster-wide: the admission counter a gateway checks against ``server.max_streams`` (it can
be over by the streams admitted elsewhere within one interval: a soft cap, said so in docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..state import redis_keys

log = logging.getLogger("lingua_fusion.cluster")
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Beat:
    gateway: str
    pid: int
    streams: tuple[str, ...]  # live stream ids on this gateway
    admitted: int  # streams admitted (holding model capacity) on this gateway
    listeners: int = 0  # room listeners connected to this gateway
    hop_retries: int = 0  # model calls this gateway sent again after a replica failed (since it started)


class Heartbeat:
    def __init__(self, redis_url: str, beat: Callable[[], Beat], *, interval_s: float = 1.0,
                 ttl_s: float = 5.0) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        self.beat = beat
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.others_admitted = 0  # streams admitted on the other live gateways, as of the last beat
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cluster-heartbeat")

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.once(), timeout=self.interval_s * 3)
            except Exception as exc:  # Redis down or slow: keep serving, try again next beat
                log.warning("cluster heartbeat failed: %s", type(exc).__name__)
            await asyncio.sleep(self.interval_s)

    async def once(self) -> None:
        mine = self.beat()
        await self.redis.set(redis_keys.cluster_gateway(mine.gateway), json.dumps(asdict(mine)),
                             px=int(self.ttl_s * 1000))
        self.others_admitted = sum(b.admitted for b in await read_beats(self.redis) if b.gateway != mine.gateway)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.redis.delete(redis_keys.cluster_gateway(self.beat().gateway)), TIMEOUT_S)
        with contextlib.suppress(Exception):
            await self.redis.aclose()


async def read_beats(redis: object) -> list[Beat]:
    """Every live gateway's last beat (``redis``: a redis.asyncio client)."""
    beats: list[Beat] = []
    async for key in redis.scan_iter(match=redis_keys.CLUSTER_GATEWAYS, count=100):  # type: ignore[attr-defined]
        raw = await redis.get(key)  # type: ignore[attr-defined]
        if raw is None:
            continue  # expired between the scan and the read
        d = json.loads(raw)
        beats.append(Beat(d["gateway"], int(d["pid"]), tuple(d["streams"]), int(d["admitted"]),
                          int(d.get("listeners", 0)), int(d.get("hop_retries", 0))))
    return beats
