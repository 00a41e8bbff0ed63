"""The write-ahead log client of a stream: every final is logged before it is sent, and none is lost when the log
fails.

``StreamLog`` is shared by a service's streams: the store (state/streams.py), its link (``StoreLink``, below:
threads, backoff, one probe at a time) and the writers of finals still unlogged when their stream closed.
``Journal`` is one stream's: writes go through one ordered backlog (the log stays in seq order); a final waits for
its write at most ``state.log_wait_s``. While the log is down or slow (Redis killed, slow, cut off) captions keep
flowing: a final that could not wait goes out marked ``durable: false`` (after a ``not_durable`` event), stays
queued (bounded) and is written when the store answers; a ``durable`` event then says up to which seq everything is
logged. When the stream ends with finals still unlogged, their writer is handed to the StreamLog, which owns it
until they are written or ``BACKLOG_AFTER_CLOSE_S`` pass.

Every write carries the journal's ``epoch`` (the stream's owner epoch, state/streams.py): when the stream was resumed
by another connection, on any worker process or server sharing the store, the store refuses it (``TakenOver``); the
finals not yet logged are dropped and the session is failed with it (the client gets ``taken_over``, close 4409).

The link (``StoreLink``): store calls run on two threads of their own, so a stalled Redis blocks neither the event
loop nor the executor the decoders use. Every call ends: the Redis client has socket timeouts, SQLite a busy
timeout. After a failure the store is left alone for a backoff (0.5 s doubling to 5 s) and then tested by one call
at a time, so a hundred streams do not pile a hundred timed-out writes onto a dead Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard, TypeVar, TypeVarTuple

from ..errors import ClientError, LinguaFusionError, StoreUnavailable, TakenOver
from .events import Durable, Error, Event, Final, NotDurable
from .wire import FinalJSON

if TYPE_CHECKING:
    from ..observability import Metrics
    from ..state.streams import StreamStore
    from .protocol import SpecJSON
    from .speakers import SpeakersJSON

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

log = logging.getLogger("lingua_fusion.streams")
STORE_WAIT_S = 10.0  # opening or resuming a stream waits this long for the stream log (queue included), then 503
BACKLOG_AFTER_CLOSE_S = 60.0  # how long unlogged finals are still written after their stream closed
MAX_UNLOGGED = 1000  # finals a stream may have sent but not logged before it is closed


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
                return await self.submit(fn, *args)
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


class StreamLog:
    """Owns its store: ``close`` closes it."""

    def __init__(self, store: StreamStore, metrics: Metrics | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.link = StoreLink(store, metrics)
        self._orphans: dict[str, asyncio.Task[None]] = {}

    async def call(self, fn: Callable[[*Ts], T], *args: *Ts, wait_s: float | None = STORE_WAIT_S) -> T:
        return await self.link.call(fn, *args, wait_s=wait_s)

    async def finals_after(self, stream_id: str, seq: int) -> list[FinalJSON]:
        """The finals logged for ``stream_id`` after ``seq``, in order, as they were sent."""
        return [e for e in await self.call(self.store.finals_after, stream_id, seq) if logged_final(e)]

    def adopt(self, stream_id: str, writer: asyncio.Task[None]) -> None:
        self._orphans[stream_id] = writer
        writer.add_done_callback(lambda t: self._orphans.pop(stream_id, None) if self._orphans.get(stream_id) is t
                                 else None)

    async def settled(self, stream_id: str, wait_s: float = STORE_WAIT_S) -> None:
        """A resume reads the log only after a closed stream's last finals reached it (or ``wait_s`` passed)."""
        writer = self._orphans.get(stream_id)
        if writer is not None and not writer.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(writer), wait_s)

    async def close(self) -> None:
        for task in self._orphans.values():
            task.cancel()
        for task in list(self._orphans.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._orphans.clear()
        self.link.close()
        self.store.close()


def logged_final(event: Mapping[str, object]) -> TypeGuard[FinalJSON]:
    """A final read back from the log: the store wrote ``Final.to_wire()``, numbered."""
    seq = event.get("seq")
    return event.get("type") == "final" and isinstance(seq, int) and not isinstance(seq, bool)


@dataclass
class _Entry:
    final: FinalJSON  # the wire form, as logged
    origin: float | None  # the stream clock's origin (media time of t=0) when it was logged
    audio: bool  # moves committed_until (audio) or text_until (text)
    speakers: SpeakersJSON | None = None  # a diarize stream's speakers after this final (stream/speakers.py)


class Journal:
    def __init__(self, log: StreamLog, stream_id: str, emit: Callable[[Event], None], *, wait_s: float,
                 max_unlogged: int = MAX_UNLOGGED, fail: Callable[[LinguaFusionError], None] | None = None) -> None:
        self.log = log
        self.stream_id = stream_id
        self._emit = emit
        self._fail = fail  # ends the session (its stream was taken over elsewhere)
        self.epoch = 0  # the stream's owner epoch this session holds: a resumed one's is set from its claim
        self.wait_s = wait_s
        self.max_unlogged = max_unlogged
        self.logged_seq = 0
        self._unlogged: deque[_Entry] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._progress = asyncio.Condition()
        self._outage = False  # a not_durable event went out and no durable one yet
        self._closed_at: float | None = None

    @property
    def pending(self) -> int:
        return len(self._unlogged)

    @property
    def full(self) -> bool:
        return len(self._unlogged) >= self.max_unlogged

    async def open(self, resume_token: str, spec: SpecJSON) -> None:
        """Record a new stream (a resumed one is in the log already)."""
        await self.log.call(self.log.store.open_stream, self.stream_id, resume_token, {"spec": spec})

    async def append(self, final: Final, origin: float | None, speakers: SpeakersJSON | None = None) -> None:
        """Log ``final`` (numbered) before it is sent; marks it ``durable = False`` when it cannot wait.
        ``speakers``: a diarize stream's speakers, kept in the snapshot with it.

        With nothing unlogged before it and the log healthy (the common case), the final is written from here: one
        hop to a store thread and back. Otherwise (an outage, a slow log) the stream's backlog writer writes it in
        order, and this waits at most ``wait_s`` for it."""
        seq = final.seq
        if speakers is not None:  # only the newest state is worth keeping (it rides with the last final written):
            for entry in self._unlogged:  # a long outage keeps one copy, not one per waiting final
                entry.speakers = None
        entry = _Entry(final.to_wire(), origin, final.modality == "audio", speakers)
        self._unlogged.append(entry)
        if self.log.metrics is not None:
            self.log.metrics.unlogged_finals.inc()
        link = self.log.link
        loop = asyncio.get_running_loop()
        until = loop.time() + (self.wait_s if link.ready() else 0.0)
        if self._writer is None or self._writer.done():
            write = None
            if len(self._unlogged) == 1 and link.ok():
                write = self._write(entry)
                try:
                    await asyncio.wait_for(asyncio.shield(write), self.wait_s)
                except Exception:  # noqa: BLE001 - handled where it is awaited again
                    pass  # still running, or failed: the backlog writer takes it from here (retries, outages)
                else:
                    await self._landed(entry)
                    return
            self._writer = asyncio.create_task(self._write_backlog(write), name=f"journal:{self.stream_id}")
        try:
            async with self._progress:
                await asyncio.wait_for(self._progress.wait_for(lambda: self.logged_seq >= seq),
                                       max(0.0, until - loop.time()))
            return
        except TimeoutError:
            if self.logged_seq >= seq:
                return  # written just as the wait ran out
        final.durable = False
        if not self._outage:
            self._outage = True
            why = "the stream log is down" if link.last_error else "the stream log is slow"
            self._emit(NotDurable(from_seq=seq, message=f"captions from {seq} on are sent before they are "
                                                         f"crash-safe ({why}); a durable event follows when they are"))

    def _write(self, entry: _Entry) -> asyncio.Future[None]:
        """``entry`` written to the store, started now on a store thread (the link must be ``ok()``)."""
        return self.log.link.submit(self._writing(entry))

    def _writing(self, entry: _Entry) -> Callable[[], None]:
        """The store call that writes ``entry`` (run on a store thread)."""
        end = float(entry.final["end"])
        args = (self.stream_id, dict(entry.final), end if entry.audio else None, entry.origin,
                None if entry.audio else end, self.epoch)
        if entry.speakers is None:
            return functools.partial(self.log.store.append_final, *args)
        return functools.partial(self.log.store.append_final, *args, speakers=dict(entry.speakers))

    async def _landed(self, entry: _Entry) -> None:
        """``entry``, first in line, is in the log."""
        self._unlogged.popleft()
        if self.log.metrics is not None:
            self.log.metrics.unlogged_finals.dec()
        async with self._progress:
            self.logged_seq = int(entry.final["seq"])
            self._progress.notify_all()
        if not self._unlogged and self._outage and self._closed_at is None:
            self._outage = False
            self._emit(Durable(through_seq=self.logged_seq))

    async def _write_backlog(self, inflight: asyncio.Future[None] | None = None) -> None:
        """The backlog, in order, until it is empty; ``inflight``: the first entry's write, already started."""
        link = self.log.link
        while self._unlogged:
            if self._closed_at is not None and time.monotonic() - self._closed_at > BACKLOG_AFTER_CLOSE_S:
                return  # the stream is gone and the log still does not answer: give up (counted as unlogged)
            if inflight is None and not link.ready():
                await asyncio.sleep(min(1.0, max(0.05, link.down_until - link.clock())))
                continue
            entry = self._unlogged[0]
            try:
                if inflight is not None:
                    await inflight
                else:  # through the link: one probe at a time while it recovers
                    await link.call(self._writing(entry))
            except TakenOver as exc:  # resumed by another connection: that session numbers and logs from here
                self._drop_unlogged()
                if self._closed_at is None and self._fail is not None:
                    self._fail(exc)
                return
            except ClientError as exc:  # the store answered: this stream is gone from it (compacted, Redis lost it)
                self._drop_unlogged()
                if self._closed_at is None:
                    self._emit(Error(exc.code, f"the stream log lost this stream: {exc.public_message}"))
                return
            except LinguaFusionError:
                await asyncio.sleep(0.05)
                continue
            finally:
                inflight = None
            await self._landed(entry)

    def _drop_unlogged(self) -> None:
        """The store refused this stream's backlog for good: nobody will write it, so it leaves the unlogged-finals
        gauge too (it stayed counted for the life of the process)."""
        if self.log.metrics is not None:
            for _ in self._unlogged:
                self.log.metrics.unlogged_finals.dec()
        self._unlogged.clear()

    async def finish(self, wait_s: float) -> int:
        """The stream ended: give the backlog ``wait_s`` seconds to reach the log, then record the stream as closed
        when nothing is left. Returns how many finals stayed unlogged. Raises ``TakenOver`` when the stream was
        resumed by another connection meanwhile (this session must not close it)."""
        if self._writer is not None and not self._writer.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._writer), wait_s)
        if not self._unlogged:
            try:
                await self.log.call(self.log.store.close_stream, self.stream_id, self.epoch)
            except TakenOver:
                raise
            except LinguaFusionError:
                pass
        return len(self._unlogged)

    def detach(self) -> None:
        """The stream closed (or its client went away): a writer with finals still to log goes on, owned by the
        StreamLog (a connection drop is not a reason to lose them); anything else stops."""
        self._closed_at = time.monotonic()
        writer = self._writer
        if writer is None or writer.done():
            return
        if self._unlogged:
            self.log.adopt(self.stream_id, writer)
        else:
            writer.cancel()
