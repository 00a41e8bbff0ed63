"""A live stream's capacity: one reservation per stream (``Hold``), made of a slot of its key's quota and the
engine's admission (across every worker of ``serve --workers``, serving/shard), and the refusals counted. The
StreamService asks ``hold`` before a stream goes live and ``unhold`` when a holder lets go; nothing else here
knows of sessions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import Overloaded
from ..serving.engine import Engine
from .protocol import StreamSpec
from .quota import KeyQuota, Quota

if TYPE_CHECKING:
    from ..observability import Metrics

__all__ = ["Hold", "KeyQuota", "Principal", "StreamCapacity"]


@dataclass(frozen=True)
class Principal:
    """Who opens a stream: an API key's id, and whether it has admin scope."""

    key_id: str
    admin: bool = False


@dataclass
class Hold:
    """A stream's one reservation here: a slot of ``key_id``'s quota and its admission by the engine. Its live
    session holds it, and so does every open of the stream under way (a resume taking it over); the last to let go
    frees it. ``admitted`` is answered once admission has: an open that finds it pending waits for that answer."""

    key_id: str
    admitted: asyncio.Future[bool]
    count: int = 1


class StreamCapacity:
    def __init__(self, engine: Engine, settings: Settings, quota: Quota, metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.quota = quota
        self.metrics = metrics  # observability.Metrics, or None
        self.holds: dict[str, Hold] = {}  # stream id -> its reservation

    async def hold(self, spec: StreamSpec, owner: str) -> Hold:
        """Capacity for ``spec``'s stream, or ``Overloaded`` (4429) with nothing else changed. A stream that holds
        a reservation here already (its session is live here, or another open of it is under way) needs no more:
        a takeover replaces a connection, it does not add a stream. Otherwise a slot of ``owner``'s quota (the key
        that opened the stream, also when an admin key resumes it: a key's streams stay within its cap) and the
        engine's admission."""
        sid = spec.stream_id
        held = self.holds.get(sid)
        if held is not None:
            held.count += 1
            try:
                admitted = await asyncio.wait_for(asyncio.shield(held.admitted),
                                                  self.settings.server.request_timeout_s)
            except BaseException:
                self.unhold(sid, held)
                raise
            if not admitted:  # the open that asked was refused (and dropped the reservation): so is this one
                self.refused()
                raise Overloaded("no capacity for this stream now; retry later", retry_after=5.0)
            return held
        held = Hold(owner, asyncio.get_running_loop().create_future())
        self.holds[sid] = held  # before the first await: another open of this stream meanwhile waits for this answer
        try:
            await self.quota.take(owner, sid)  # on Redis a round trip (stream/quota.py)
        except BaseException as exc:
            del self.holds[sid]
            held.admitted.set_result(False)
            if isinstance(exc, Overloaded):
                self.refused()
            raise
        try:
            await self.engine.reserve(self.engine.demand(sid, spec.slo, spec.source_lang, spec.targets,
                                                         spec.partials, spec.policy.step_s, spec.inputs,
                                                         spec.source_langs, spec.diarize), owner)
        except BaseException as exc:
            if isinstance(exc, Overloaded) and exc.not_serving:  # its model process restarting or silent
                self.unavailable()
            del self.holds[sid]
            self.quota.give(owner, sid)
            held.admitted.set_result(False)
            raise
        held.admitted.set_result(True)
        return held

    def unhold(self, stream_id: str, held: Hold) -> None:
        """One holder of ``stream_id``'s reservation lets go; the last frees its quota slot and admission."""
        if self.holds.get(stream_id) is not held:
            return  # refused, so dropped already
        held.count -= 1
        if held.count == 0:
            del self.holds[stream_id]
            self.engine.release(stream_id)
            self.quota.give(held.key_id, stream_id)

    def release(self, stream_id: str) -> None:
        """The stream's live session let go of its reservation."""
        held = self.holds.get(stream_id)
        if held is not None:
            self.unhold(stream_id, held)

    def refused(self) -> None:
        """A refusal decided by the service (the key's cap, a class whose breaker is down) counts with admission's
        own (``Executor.admit`` counts those)."""
        if self.metrics is not None:
            self.metrics.streams_rejected.inc()

    def unavailable(self) -> None:
        """A refusal because the server cannot serve a new stream at all just now (``Overloaded.not_serving``):
        counted apart from the refusals for room, so a rolling restart does not read as a full server."""
        if self.metrics is not None:
            self.metrics.streams_unavailable.inc()


def open_quota(redis_url: str | None, limit: int) -> Quota:
    """``RedisKeyQuota`` (stream/redis_quota.py) with a Redis URL, else ``KeyQuota``. The Redis one is imported only
    then: redis-py imports the OpenTelemetry SDK, which a server with tracing off must not load
    (tests/service/test_tracing.py)."""
    if redis_url:
        from .redis_quota import RedisKeyQuota

        return RedisKeyQuota(redis_url, limit)
    return KeyQuota(limit)
