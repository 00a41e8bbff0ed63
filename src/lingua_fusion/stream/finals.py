"""A stream's finals, in input order: commit jobs are queued (bounded: too many pending closes the stream) and
awaited one by one; each final is numbered 1, 2, 3, ... with no gaps, logged (stream/journal.py), timed, sent with
its metrics, then spoken when the stream asked for speech."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import LinguaFusionError, Overloaded, StoreUnavailable
from ..tracing import TraceRef, span
from .contracts import Emit, Spawn
from .events import Error, Final, Metrics, Speech
from .jobs import StreamJobs
from .journal import Journal
from .protocol import StreamSpec
from .timeline import AudioTimeline


class Finals:
    def __init__(self, spec: StreamSpec, jobs: StreamJobs, journal: Journal | None, timeline: AudioTimeline,
                 caption_done: Callable[[float], None], fail: Callable[[LinguaFusionError], None], emit: Emit,
                 spawn: Spawn, trace: TraceRef | None = None) -> None:
        self.spec = spec
        self.jobs = jobs
        self.journal = journal
        self.timeline = timeline  # its origin goes into the log with each final
        self._caption_done = caption_done  # a final went out this many seconds after its words arrived
        self._fail = fail
        self._emit = emit
        self._spawn = spawn
        self.trace = trace
        self.pending: asyncio.Queue[asyncio.Task[Final | None] | None] = asyncio.Queue(maxsize=64)
        self.seq = 0

    def queue(self, job: Coroutine[Any, Any, Final | None]) -> None:
        task = self._spawn(job, "commit")
        try:
            self.pending.put_nowait(task)
        except asyncio.QueueFull:
            task.cancel()
            # the server's own backlog (commit jobs not yet translated), not a client that stopped reading (that is
            # the Outbox's slow_consumer): the stream sends input faster than it is captioned
            self._fail(Overloaded(f"too many captions pending ({self.pending.maxsize}): this stream sends input "
                                  "faster than the server can caption it; send less often and resume",
                                  retry_after=1.0))

    async def end(self) -> None:
        """No more jobs: ``run`` returns once the queued ones are sent."""
        await self.pending.put(None)

    async def run(self, drain_timeout_s: float) -> int:
        """Send every queued job's final until ``end``; then wait for the log (at most ``drain_timeout_s``).
        Returns how many finals were sent but not logged."""
        while True:
            job = await self.pending.get()
            if job is None:
                break
            try:
                final = await job
            except LinguaFusionError as exc:
                self._emit(Error(exc.code, exc.public_message))
                continue
            if final is not None:
                await self._send(final)
        if self.journal is None:
            return 0
        return await self.journal.finish(drain_timeout_s)

    async def _send(self, final: Final) -> None:
        self.seq += 1
        final.seq = self.seq
        if self.journal is not None:
            if self.journal.full:
                final.durable = False
                self._fail(StoreUnavailable("the stream log has been unavailable too long; the stream was closed"))
                return
            with span(self.trace, "journal.write", seq=final.seq) as write:
                await self.journal.append(final, self.timeline.origin)
                if write is not None:
                    write.set(durable=final.durable is not False)  # False: sent before the log had it
        latency = time.monotonic() - final.wall_ref
        final.latency_ms["caption"] = round(latency * 1000, 1)
        self._caption_done(latency)
        self._emit(final)
        self._emit(Metrics(seq=self.seq, latency_ms=final.latency_ms,
                           queue_depth={str(k): self.jobs.port.depth(k) for k in self.jobs.model_keys()}))
        if self.spec.speech and final.text:
            await self._speech(final)

    async def _speech(self, final: Final) -> None:
        target = self.spec.targets[0]
        try:
            wav = await self.jobs.speak(final.text, target)
        except LinguaFusionError as exc:
            self._emit(Error(exc.code, f"speech for caption {final.seq} failed: {exc.public_message}"))
            return
        if wav:
            self._emit(Speech(seq=final.seq, lang=target, audio_base64=base64.b64encode(wav).decode("ascii")))
