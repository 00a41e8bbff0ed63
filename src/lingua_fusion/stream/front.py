"""The streams' front door: which StreamService a start message goes to, and what is done to every one of them.

A server runs two StreamServices side by side, neither inside the other: the batched one every stream uses, and
the per-stream baseline (an executor in ``per-stream`` mode, one unbatched call per stream, as WhisperLive and
whisper_streaming serve) that an admin key may ask for with ``"engine": "per-stream"`` to measure the batched
engine against (``linguafusion bench load --baseline``). The WebSocket route opens streams through ``open``; a
revoked key's streams, a drain and the tracer reach both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..errors import InvalidParameter, PermissionDenied
from ..tracing import Tracer
from .capacity import Principal
from .service import Opened, StreamService

ENGINES = ("batched", "per-stream")


class StreamFront:
    def __init__(self, batched: StreamService, per_stream: StreamService | None = None) -> None:
        self.batched = batched
        self.per_stream = per_stream

    def services(self) -> list[StreamService]:
        return [self.batched] + ([self.per_stream] if self.per_stream is not None else [])

    async def open(self, msg: Mapping[str, object], who: Principal) -> Opened:
        """Open (or resume) a stream on the service its start message's ``engine`` names (default ``batched``;
        ``per-stream`` only for an admin key)."""
        engine = str(msg.get("engine", "batched"))
        if engine not in ENGINES or (engine == "per-stream" and self.per_stream is None):
            raise InvalidParameter(f"engine must be one of {list(ENGINES)}")
        if engine == "batched":
            return await self.batched.open(msg, who)
        if not who.admin:
            raise PermissionDenied("the per-stream baseline engine is for benchmarks: it needs an admin key")
        assert self.per_stream is not None
        return await self.per_stream.open({**msg, "engine": "batched"}, who)

    def key_ids(self) -> set[str]:
        """The keys with a live stream on any service."""
        return {s.spec.key_id for svc in self.services() for s in svc.sessions.values()}

    async def revoke(self, key_id: str) -> int:
        """A key was revoked: its live streams end now, on every service. Returns how many."""
        return sum([await svc.revoke(key_id) for svc in self.services()])

    async def drain(self, deadline_s: float) -> None:
        """Drain every service at once, within one deadline."""
        await asyncio.gather(*(svc.drain(deadline_s) for svc in self.services()))

    def trace(self, tracer: Tracer) -> None:
        for svc in self.services():
            svc.tracer = tracer

    async def close(self) -> None:
        for svc in self.services():
            await svc.close()
