"""Admission for file requests: bounded concurrency, a bounded queue, 429 beyond it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from ..errors import Overloaded
from ..observability import Metrics


class Admission:
    """Bounded concurrency: at most ``running`` translations at once and ``waiting`` queued; beyond, 429."""

    def __init__(self, running: int, waiting: int, metrics: Metrics) -> None:
        self.limiter = anyio.CapacityLimiter(running)
        self.max_waiting = waiting
        self.waiting = 0
        self.metrics = metrics

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self.limiter.available_tokens == 0 and self.waiting >= self.max_waiting:
            self.metrics.rejected.inc()
            raise Overloaded("the server is at capacity; retry later", retry_after=2.0)
        self.waiting += 1
        self.metrics.waiting.set(self.waiting)
        try:
            await self.limiter.acquire()
        finally:
            self.waiting -= 1
            self.metrics.waiting.set(self.waiting)
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self.metrics.in_flight.dec()
            self.limiter.release()
