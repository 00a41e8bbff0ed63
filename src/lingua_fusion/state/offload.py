"""The key store's blocking calls, off the event loop: a small pool of its own, a bound on waiting calls, a timeout.

A ``UserStore`` call is a SQLite read (microseconds, but a locked file waits its busy timeout) or a Redis round
trip (a stalled Redis waits its socket timeout). Neither may hold the event loop, so the routes ``await
offload(store.method, ...)``. The pool is the store's own: model work on the default executor cannot starve
authentication. At most ``max_waiting`` calls wait for a thread; one more is refused at once (429 ``overloaded``),
and a call not answered within ``timeout_s`` is a 503 ``backend_unavailable`` (its thread finishes on its own).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from ..errors import BackendError, Overloaded

P = ParamSpec("P")
T = TypeVar("T")


class Offload:
    def __init__(self, threads: int = 4, *, max_waiting: int = 256, timeout_s: float = 5.0) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lf-state")
        self._max_waiting = max_waiting
        self._waiting = 0  # touched on the event loop only
        self.timeout_s = timeout_s

    async def __call__(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._waiting >= self._max_waiting:
            raise Overloaded("the key store has too many calls waiting; retry shortly", retry_after=1.0)
        self._waiting += 1
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError as exc:
            raise BackendError(f"the key store did not answer within {self.timeout_s:g} s") from exc
        finally:
            self._waiting -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
