"""Admission for file requests: bounded concurrency, a bounded waiting room, 429 beyond it, and a fair share per key.

``FairQueue`` is the pure core (no I/O, no clock): who may run now, who waits, who is refused. Keys share the
running slots max-min fairly: a freed slot goes to the waiting key that holds the fewest slots (ties: the key served
longest ago, then the oldest request). When the waiting room is full, a request from a key that holds fewer
waiting places than the heaviest key takes the heaviest key's newest place (that request is refused with 429
instead); otherwise the newcomer is refused. One key can therefore queue everything only while nobody else asks.
``Admission`` runs it on asyncio: ``async with admission.slot(key_id, wait_s):``, or ``admission.run(key_id,
deadline, fn)`` for work on a thread: the caller gets its answer (or 504) by the deadline, and the slot stays taken
until the thread really returns, so the bound on concurrent work holds even for work that overruns. Those threads
are the admission's own, one per running slot, at a lower CPU priority (``server.file_nice``): a file's decoding
waits for live streams' work, whose models' threads and event loop keep the server's priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from ..deadline import Deadline
from ..errors import Draining, Overloaded, RequestTimeout
from ..observability import Metrics

T = TypeVar("T")
GRACE_S = 5.0  # past its deadline, work that has not stopped itself (one long decode) is no longer waited for


@dataclass(eq=False)
class Ticket:
    """One request: it runs once ``granted``; ``refused`` when another key's request took its waiting place."""

    key: str
    n: int
    granted: bool = False
    refused: bool = False


@dataclass
class FairQueue:
    running_limit: int
    waiting_limit: int
    running: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waiting: dict[str, deque[Ticket]] = field(default_factory=lambda: defaultdict(deque))
    _last_served: dict[str, int] = field(default_factory=dict)
    _n: itertools.count[int] = field(default_factory=itertools.count)

    def running_total(self) -> int:
        return sum(self.running.values())

    def waiting_total(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def arrive(self, key: str) -> tuple[Ticket | None, Ticket | None]:
        """A request of ``key`` arrives. Returns (its ticket, or None when refused; a ticket it displaced, which
        the caller refuses). The ticket may be granted at once."""
        ticket = Ticket(key, next(self._n))
        if self.running_total() < self.running_limit and not self.waiting_total():
            self._grant(ticket)
            return ticket, None
        displaced = None
        if self.waiting_total() >= self.waiting_limit:
            heaviest = max(self.waiting, key=lambda k: (len(self.waiting[k]), self.running[k]), default=None)
            mine = len(self.waiting.get(key, ()))
            if heaviest is None or heaviest == key or len(self.waiting[heaviest]) <= mine:
                return None, None
            displaced = self.waiting[heaviest].pop()  # its newest request
            displaced.refused = True
            self._tidy(heaviest)
        self.waiting[key].append(ticket)
        return ticket, displaced

    def leave(self, ticket: Ticket) -> list[Ticket]:
        """``ticket`` is done (it ran, or gave up waiting). Returns the tickets granted in its place."""
        if ticket.granted:
            self.running[ticket.key] -= 1
            if not self.running[ticket.key]:
                del self.running[ticket.key]
        elif not ticket.refused:
            with contextlib.suppress(ValueError):
                self.waiting[ticket.key].remove(ticket)
            self._tidy(ticket.key)
        return self._fill()

    def _fill(self) -> list[Ticket]:
        granted = []
        while self.running_total() < self.running_limit and self.waiting_total():
            key = min(self.waiting, key=lambda k: (self.running.get(k, 0), self._last_served.get(k, -1),
                                                   self.waiting[k][0].n))
            ticket = self.waiting[key].popleft()
            self._tidy(key)
            self._grant(ticket)
            granted.append(ticket)
        return granted

    def _grant(self, ticket: Ticket) -> None:
        ticket.granted = True
        self.running[ticket.key] += 1
        self._last_served[ticket.key] = ticket.n

    def _tidy(self, key: str) -> None:
        if key in self.waiting and not self.waiting[key]:
            del self.waiting[key]


def lower_priority(nice: int) -> None:
    """This thread's CPU priority lowered by ``nice`` (Linux keeps a nice value per thread, and threads it starts,
    a decoder's, inherit it); where that cannot be done the thread runs at the process's priority."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: the same priority
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class Admission:
    """At most ``running`` translations at once and ``waiting`` queued, shared fairly between keys; 429 beyond."""

    def __init__(self, running: int, waiting: int, metrics: Metrics, *, nice: int = 0) -> None:
        self.queue = FairQueue(running, waiting)
        self.metrics = metrics
        # one thread per running slot: a slot is held until its thread returns, so no work waits here for a thread
        self._threads = ThreadPoolExecutor(max_workers=max(1, running), thread_name_prefix="file-work",
                                           initializer=lower_priority, initargs=(nice,))
        self._events: dict[Ticket, asyncio.Event] = {}
        self._overrunning: set[asyncio.Task[object]] = set()  # work whose caller stopped waiting, still in its slot
        self._drained = asyncio.Event()  # set once the server stops (begin_drain): answers are due by _drain_at
        self._drain_at: float | None = None

    def begin_drain(self, within_s: float) -> None:
        """The server is stopping, and its connections are cut ``within_s`` (and a little) from now: a request still
        running then is answered Draining (503, retry: another server or this one restarted) instead of being cut
        off with a bare 500. Its thread runs on until it ends (a thread cannot be stopped)."""
        self._drain_at = asyncio.get_running_loop().time() + within_s
        self._drained.set()

    async def run(self, key_id: str, deadline: Deadline, fn: Callable[[], T]) -> T:
        """``fn()`` on a worker thread within a slot of the key's share. Waits at most until ``deadline`` plus
        GRACE_S (then RequestTimeout, 504); the slot is held until the thread returns, whatever the caller does."""

        async def held() -> T:
            async with self.slot(key_id, wait_s=max(0.0, deadline.left())):
                return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

        task = asyncio.create_task(held(), name=f"file-request:{key_id}")
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, deadline.left()) + GRACE_S
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({task, drained}, timeout=max(0.0, end - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and self._drain_at is not None:  # the server began to stop: answer by its time
                await asyncio.wait({task}, timeout=max(0.0, min(end, self._drain_at) - loop.time()))
            if task.done():
                return task.result()
            if self._drain_at is not None and self._drain_at <= end:
                raise Draining("the server is shutting down; send the request again (to another server, or "
                               "to this one once it is back)")
            raise RequestTimeout(f"the request took longer than {deadline.seconds:g} s; send less or retry later",
                                 details={"limit": "request_timeout_s"})
        finally:
            drained.cancel()
            await asyncio.gather(drained, return_exceptions=True)
            if not task.done():  # overran, or the client went away: it keeps its slot until the thread ends
                self._overrunning.add(task)
                task.add_done_callback(self._settled)

    def close(self) -> None:
        """At shut-down: threads still running end on their own (they are not waited for)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _settled(self, task: asyncio.Task[object]) -> None:
        self._overrunning.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: nobody is waiting for it any more

    @contextlib.asynccontextmanager
    async def slot(self, key_id: str = "", wait_s: float | None = None) -> AsyncIterator[None]:
        """Run within a slot of the key's fair share; Overloaded (429) when refused, displaced by another key's
        request, or still waiting after ``wait_s``."""
        ticket, displaced = self.queue.arrive(key_id)
        if displaced is not None:
            self._wake(displaced)
        if ticket is None:
            self._refused()
        assert ticket is not None
        try:
            if not ticket.granted:
                await self._wait(ticket, wait_s)
            self.metrics.in_flight.inc()
            try:
                yield
            finally:
                self.metrics.in_flight.dec()
        finally:
            for t in self.queue.leave(ticket):
                self._wake(t)
            self._events.pop(ticket, None)
            self._gauge()

    async def _wait(self, ticket: Ticket, wait_s: float | None) -> None:
        event = self._events[ticket] = asyncio.Event()
        self._gauge()
        try:
            async with asyncio.timeout(wait_s):
                await event.wait()
        except TimeoutError:
            if not ticket.granted:
                self._refused("the server stayed busy for this request's whole time limit; retry later")
        if ticket.refused:
            self._refused("another key's request took this one's place in the queue (each key gets a fair "
                          "share); retry later")

    def _wake(self, ticket: Ticket) -> None:
        event = self._events.get(ticket)
        if event is not None:
            event.set()

    def _refused(self, why: str = "the server is at capacity; retry later") -> None:
        self.metrics.rejected.inc()
        raise Overloaded(why, retry_after=2.0)

    def _gauge(self) -> None:
        self.metrics.waiting.set(self.queue.waiting_total())
