"""Gateways' heartbeats in Redis: who is alive, which streams each holds, how many streams the cluster admitted,
and the drain signal.

Each gateway writes one key (state/redis_keys.py ``cluster_gateway``) every ``interval_s`` with a TTL of
``ttl_s``, so a killed gateway drops out within ``ttl_s`` without anyone cleaning up. Reading every live key gives
the streams admitted cluster-wide: the admission counter a gateway checks against ``server.max_streams`` (it can
be over by the streams admitted elsewhere within one interval: a soft cap, said so in docs/cluster.md). Keys are
per cluster (its proxy's host:port), so clusters sharing a Redis do not count each other.

Draining: ``request_drain`` (what ``serve --cluster`` does on SIGTERM) sets the cluster's drain key; each gateway
sees it at its next beat and drains its streams once (the single server's SIGTERM drain: queued captions logged
and sent, clients told to reconnect), and says so in its beat; ``wait_drained`` waits for every gateway to say it
drained and hold no stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass

from ..state import redis_keys

log = logging.getLogger("lingua_fusion.cluster")
TIMEOUT_S = 2.0
DRAIN_KEY_TTL_S = 120


def cluster_name(host: str, port: int) -> str:
    """A cluster's name in Redis keys: its proxy's address (``serve --cluster --host --port``)."""
    return f"{host}:{port}"


@dataclass(frozen=True)
class Beat:
    gateway: str
    pid: int
    streams: tuple[str, ...]  # live stream ids on this gateway
    admitted: int  # streams admitted (holding model capacity) on this gateway
    listeners: int = 0  # room listeners connected to this gateway
    hop_retries: int = 0  # model calls this gateway sent again after a replica failed (since it started)
    draining: bool = False  # the cluster's drain signal was seen: this gateway drained its streams
    node: str = ""  # the Ray node it runs on (node.py)
    state_dir: str = ""  # its own state directory on that node


class Heartbeat:
    def __init__(self, redis_url: str, cluster: str, beat: Callable[[], Beat], *,
                 on_drain: Callable[[], Coroutine[object, None, None]] | None = None, interval_s: float = 1.0,
                 ttl_s: float = 5.0) -> None:
        import redis.asyncio as aioredis

        self.redis = aioredis.from_url(redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        self.cluster = cluster
        self.beat = beat
        self.on_drain = on_drain
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.others_admitted = 0  # streams admitted on the other live gateways, as of the last beat
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._drain: asyncio.Task[None] | None = None

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
        if not self.draining and await self.redis.exists(redis_keys.cluster_drain(self.cluster)):
            self.draining = True
            if self.on_drain is not None:
                self._drain = asyncio.create_task(self.on_drain(), name="cluster-drain")
        mine = self.beat()
        await self.redis.set(redis_keys.cluster_gateway(self.cluster, mine.gateway), json.dumps(asdict(mine)),
                             px=int(self.ttl_s * 1000))
        beats = await read_beats(self.redis, self.cluster)
        self.others_admitted = sum(b.admitted for b in beats if b.gateway != mine.gateway)

    async def close(self) -> None:
        for task in (self._task, self._drain):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        with contextlib.suppress(Exception):
            key = redis_keys.cluster_gateway(self.cluster, self.beat().gateway)
            await asyncio.wait_for(self.redis.delete(key), TIMEOUT_S)
        with contextlib.suppress(Exception):
            await self.redis.aclose()


async def read_beats(redis: object, cluster: str) -> list[Beat]:
    """Every live gateway's last beat in ``cluster`` (``redis``: a redis.asyncio client)."""
    beats: list[Beat] = []
    pattern = redis_keys.cluster_gateways(cluster)
    async for key in redis.scan_iter(match=pattern, count=100):  # type: ignore[attr-defined]
        raw = await redis.get(key)  # type: ignore[attr-defined]
        if raw is None:
            continue  # expired between the scan and the read
        d = json.loads(raw)
        beats.append(Beat(d["gateway"], int(d["pid"]), tuple(d["streams"]), int(d["admitted"]),
                          int(d.get("listeners", 0)), int(d.get("hop_retries", 0)), bool(d.get("draining", False)),
                          str(d.get("node", "")), str(d.get("state_dir", ""))))
    return beats


def request_drain(redis_url: str, cluster: str, *, on: bool = True) -> None:
    """Set (or with ``on=False`` clear) ``cluster``'s drain signal. Synchronous: the serve driver calls it."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    try:
        if on:
            client.set(redis_keys.cluster_drain(cluster), "1", ex=DRAIN_KEY_TTL_S)
        else:
            client.delete(redis_keys.cluster_drain(cluster))
    finally:
        client.close()


def wait_drained(redis_url: str, cluster: str, timeout_s: float) -> bool:
    """Wait until every live gateway of ``cluster`` drained and holds no stream (or ``timeout_s``)."""
    import redis.asyncio as aioredis

    async def drained() -> bool:
        client = aioredis.from_url(redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        try:
            beats = await read_beats(client, cluster)
        finally:
            await client.aclose()
        return all(b.draining and not b.streams for b in beats)

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            if asyncio.run(drained()):
                return True
        time.sleep(0.5)
    return False
