"""The commit policy's decisions applied to a stream: a partial is a tentative re-decode (at most one in flight,
none while the class drops partials) sent as ``partial``, or ``revision`` when it no longer extends the last one; a
commit cuts its audio off the timeline and queues it as a job (stream/jobs.py) for the finals, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

import numpy as np

from .contracts import Alive, Degraded, Emit, Spawn
from .events import Final, Partial, Revision
from .ingest import Arrivals
from .jobs import StreamJobs
from .policy import CommitPolicy, Decision
from .protocol import StreamSpec
from .timeline import AudioTimeline


class Decisions:
    def __init__(self, spec: StreamSpec, timeline: AudioTimeline, policy: CommitPolicy, jobs: StreamJobs,
                 arrivals: Arrivals, queue: Callable[[Coroutine[object, object, Final | None]], None],
                 degraded: Degraded, live: Alive, emit: Emit, spawn: Spawn) -> None:
        self.spec = spec
        self.timeline = timeline
        self.policy = policy
        self.jobs = jobs
        self.arrivals = arrivals
        self._queue = queue  # a commit's job, for the finals in order (stream/finals.py)
        self._degraded = degraded
        self._live = live  # a partial still worth sending: the stream is live
        self._emit = emit
        self._spawn = spawn
        self._partial: asyncio.Task[None] | None = None
        self._utterance = 0
        self._last_partial = ""
        self._revision = 0

    def apply(self, d: Decision) -> None:
        if d.kind == "partial" and self.spec.partials and not self._degraded("drop_partials") \
                and (self._partial is None or self._partial.done()):
            audio = self.timeline.view(d.start, d.end).copy()
            self._partial = self._spawn(self._partial_job(audio, d, self._utterance), "partial")
        elif d.kind == "commit":
            audio = self.timeline.view(d.start, d.end).copy()
            self._queue(self.jobs.commit(audio, d.start, d.end, self.arrivals.of(d.end), d.cut or "pause"))
            self._utterance += 1
            self._last_partial = ""
            self.timeline.consume_s(d.end)

    async def _partial_job(self, audio: np.ndarray, d: Decision, utterance: int) -> None:
        res = await self.jobs.partial(audio, lambda: utterance == self._utterance and self._live())
        if res is None:
            return
        stable = self.policy.stable(res.text.split())
        kind: type[Partial] = Partial
        if self._last_partial and not res.text.startswith(self._last_partial):
            kind = Revision
            self._revision += 1
        self._last_partial = res.text
        self._emit(kind(start=round(d.start, 3), end=round(d.end, 3), source_text=res.text,
                        stable_text=" ".join(stable), text=res.translation, confidence=res.confidence,
                        revision=self._revision))
