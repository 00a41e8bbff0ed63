"""One view of many servers' metrics: each replica's /metrics labelled with who it is, and all of them merged.

- ``labelled(text, labels)``: a Prometheus text page with ``labels`` (``replica``, ``role``) added to every sample.
  A cluster gateway's /metrics is labelled so (``server.role`` "gateway", ``server.replica`` its id); so is a
  server given ``server.replica``.
- ``merge(pages)``: several labelled pages as one valid page: each metric family's ``# HELP`` and ``# TYPE`` once,
  then every replica's samples of it (a page concatenated as it is would repeat them, which Prometheus refuses).
- ``Publisher``: with ``state.redis_url`` set, every server writes its labelled page to Redis every
  ``server.metrics_publish_interval_s`` (a key per replica that expires after three intervals, so a dead replica
  leaves the view; an index of replicas by expiry, so the view never scans the keyspace), and reads every
  replica's back for ``GET /metrics/cluster`` and the operations page's cluster view
  (``GET /v1/ops/metrics?scope=cluster``). The pure functions take and give bytes; the publisher's Redis calls
  are async with timeouts, and a failure leaves the last view (or none) and is logged, never raised to a request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from .errors import BackendError
from .state import redis_keys as rk

log = logging.getLogger("lingua_fusion.metrics")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")
MAX_REPLICAS = 256  # pages read for one cluster view


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labelled(text: bytes, labels: dict[str, str]) -> bytes:
    """``text`` with ``labels`` first on every sample line (comments and blank lines as they are)."""
    extra = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    out = []
    for line in text.decode("utf-8").splitlines():
        m = SAMPLE.match(line) if line and not line.startswith("#") else None
        if m is None:
            out.append(line)
            continue
        name, current, rest = m.group(1), m.group(2), m.group(3)
        inner = current[1:-1] if current else ""
        out.append(f"{name}{{{extra}{',' if inner else ''}{inner}}}{rest}")
    return ("\n".join(out) + "\n").encode("utf-8")


def merge(pages: Iterable[bytes]) -> bytes:
    """One page from several: families in the order first seen, each with its header once and every page's
    samples (samples before any header, which a valid page does not have, are kept first)."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for page in pages:
        family = ""
        for line in page.decode("utf-8").splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                seen = headers.setdefault(family, [])
                samples.setdefault(family, [])
                if not any(h.split(" ", 3)[1] == line.split(" ", 3)[1] for h in seen):
                    seen.append(line)
            elif line and not line.startswith("#"):
                samples.setdefault(family, []).append(line)
    out: list[str] = []
    for family, lines in samples.items():
        out.extend(headers.get(family, []))
        out.extend(lines)
    return ("\n".join(out) + "\n").encode("utf-8")


class ParsedRegistry:
    """A page's metric families behind ``collect()``, as a CollectorRegistry offers them (api/opsview.py reads it)."""

    def __init__(self, page: bytes) -> None:
        self._families = list(text_string_to_metric_families(page.decode("utf-8")))

    def collect(self) -> Iterator[Metric]:
        yield from self._families


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
