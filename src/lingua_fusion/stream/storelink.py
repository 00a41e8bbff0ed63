"""The async side of the stream log, shared by every stream of a hub.

Store calls run on two threads of their own, so a stalled Redis blocks neither the event loop nor the executor the
decoders use. Every call ends: the Redis client has socket timeouts, SQLite a busy timeout. After a failure the
store is left alone for a backoff (0.5 s doubling to 5 s) and then tested by one call at a time, so a hundred
streams do not pile a hundred timed-out writes onto a dead Redis. While it is down, sessions keep their finals in
a bounded backlog and write them, in order, when it answers again (stream/journal.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

from ..errors import ClientError, LinguaFusionError, StoreUnavailable

if TYPE_CHECKING:
    from ..observability import Metrics
    from ..state.streams import StreamStore

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
log = logging.getLogger("lingua_fusion.streams")
STORE_WAIT_S = 10.0  # opening or resuming a stream waits this long for the stream log (queue included), then 503


class StoreLink:
    def __init__(self, store: StreamStore, metrics: Metrics | None = None, *,
                 clock: Callable[[], float] = time.monotonic, max_backoff_s: float = 5.0) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.max_backoff_s = max_backoff_s
        self.failures = 0  # consecutive
        self.down_until = 0.0
        self.last_error = ""
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stream-store")
        self._probe = asyncio.Lock()

    def ok(self) -> bool:
        return self.failures == 0

    def ready(self) -> bool:
        """Worth a try now: healthy, or down with its backoff over."""
        return self.clock() >= self.down_until

    async def call(self, fn: Callable[[*Ts], T], *args: *Ts, wait_s: float | None = None) -> T:
        """``fn(*args)`` (a method of the store) on the store's threads; StoreUnavailable while it is down, when it
        fails, or when the answer (queueing behind other streams' writes included) takes over ``wait_s``."""
        if wait_s is None:
            return await self._call(fn, args)
        try:
            return await asyncio.wait_for(self._call(fn, args), wait_s)
        except TimeoutError as exc:
            raise StoreUnavailable(f"the stream log did not answer in {wait_s:.0f} s; retry") from exc

    async def _call(self, fn: Callable[[*Ts], T], args: tuple[*Ts]) -> T:
        if not self.ready():
            raise StoreUnavailable(f"the stream log is unavailable ({self.last_error}); retrying")
        if self.failures:
            async with self._probe:  # recovering: one probe at a time
                if not self.ready():
                    raise StoreUnavailable(f"the stream log is unavailable ({self.last_error}); retrying")
                return await self._do(fn, args)
        return await self._do(fn, args)

    async def _do(self, fn: Callable[[*Ts], T], args: tuple[*Ts]) -> T:
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[[*Ts], T], *args: *Ts) -> asyncio.Future[T]:
        """``fn(*args)`` started on a store thread now: a future (no task in between) with its answer, or the typed
        error of a failed store (counted, and the store left alone for its backoff). Only for a healthy store
        (``ok()``): ``call`` is the way in while it recovers (one probe at a time)."""
        loop = asyncio.get_running_loop()
        out: asyncio.Future[T] = loop.create_future()
        loop.run_in_executor(self._pool, fn, *args).add_done_callback(lambda done: self._settle(done, out))
        return out

    def _settle(self, done: asyncio.Future[T], out: asyncio.Future[T]) -> None:
        """On the loop: a store call's answer into ``out``, its failure counted and typed."""
        if done.cancelled():
            out.cancel()
            return
        exc = done.exception()
        if exc is None:
            self.failures = 0
            self.down_until = 0.0
            if not out.done():
                out.set_result(done.result())
            return
        if isinstance(exc, (LinguaFusionError, OSError, sqlite3.Error, json.JSONDecodeError)) and not isinstance(
                exc, ClientError):  # a read of SQLite that stayed locked or hit a bad file, a snapshot that does
            # not parse: the store failed, typed like an outage (a ClientError is the store's answer: not found)
            self.failures += 1
            self.last_error = (exc.message if isinstance(exc, LinguaFusionError) else str(exc))[:200]
            if self.failures == 1:  # the details go to the log; clients are told the log is unavailable
                log.warning("stream log call failed: %s", self.last_error)
            self.down_until = self.clock() + min(self.max_backoff_s, 0.5 * 2 ** (self.failures - 1))
            if self.metrics is not None:
                self.metrics.store_failures.inc()
            failed = StoreUnavailable(f"the stream log is unavailable ({self.last_error})")
            failed.__cause__ = exc
            exc = failed
        if not out.done():
            out.set_exception(exc)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
