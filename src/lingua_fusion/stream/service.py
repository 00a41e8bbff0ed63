"""The StreamService: the one owner of live streams, used by the WebSocket route and by in-process streams alike.

``open`` runs the whole ceremony of a stream's start (auth is the caller's): the start message parsed (or the resumed
stream read), the drain check, capacity, for a resume the take-over (capacity first: a resume refused for it has
taken nothing over), registration, the ``ready`` event, and for a resume the finals the client missed. ``drain`` ends
every stream for a shutdown, ``close`` every stream here, and nothing else: what was handed in is its maker's to close.
The parts are modules of their own: ``StreamCapacity`` (stream/capacity.py: the key's quota and the engine's
admission, one reservation per stream however many connections take it over in turn), ``Takeovers``
(stream/resume.py: a resume's read, claim and replay, on this worker or across the stream store), ``KeyPixels``
(stream/per_key.py: a key's pixel budget) and ``BreakerSupervisor`` (stream/supervisor.py: the SLO breakers, their
notices, thinning and shedding), which whoever builds the engine makes and gives to the engine as its StageObserver
(``observer=``) and here (``supervisor=``), where it is bound to these streams: the service never wires the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import Settings
from ..errors import AuthenticationError, Draining, InvalidParameter, Overloaded
from ..glossary import Term
from ..serving.engine import Engine
from ..tracing import Tracer
from .capacity import KeyQuota, Principal, StreamCapacity
from .contracts import Slots, Vocabularies
from .events import Closed, Event
from .journal import StreamLog
from .per_key import KeyPixels, vocabulary_of
from .protocol import ResumeRequest, parse_resume, parse_start
from .quota import Quota
from .resume import Takeovers
from .room_host import RoomHost
from .session import StreamSession
from .supervisor import BreakerSupervisor
from .tenant_breaker import TenantBreaker

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.streams")
DRAIN_POLL_S = 0.05


@dataclass
class Opened:
    """A stream that is live: what to send first (``ready``; on a resume the finals the client missed, and
    ``closed`` when the stream had ended already), then the session's own events."""

    session: StreamSession
    greeting: list[Event]
    finished: bool = False


class StreamService:
    def __init__(self, executor: Engine, settings: Settings, *, supervisor: BreakerSupervisor,
                 log: StreamLog | None = None, metrics: Metrics | None = None,
                 glossary_for: Callable[[Principal, str], Awaitable[list[Term]]] | None = None,
                 quota: Quota | None = None) -> None:
        self.executor = executor
        self.settings = settings
        self.log = log
        self.metrics = metrics
        self.glossary_for = glossary_for
        self.capacity = StreamCapacity(executor, settings, quota or KeyQuota(settings.server.max_streams_per_key),
                                       metrics)
        self.sessions: dict[str, StreamSession] = {}
        self.takeovers = Takeovers(log, self.sessions)  # a resume's read, claim and replay (stream/resume.py)
        self.pixels = KeyPixels(settings.limits, self.sessions)  # each key's, for all its streams (stream/per_key.py)
        self.image_slots = Slots(settings.server.max_images_in_flight)  # decoded frames, all streams together
        self.draining = False
        # the engine was built with this supervisor as its StageObserver (``observer=``): it reports there itself
        self.supervisor = supervisor
        supervisor.watch(lambda: self.executor.clock(), lambda: self.sessions.values())
        self.tracer: Tracer | None = None  # set when tracing is on: each stream gets a span (lingua_fusion/tracing)
        self.rooms: RoomHost | None = None  # set by the app: streams started with "room" publish there (rooms/)
        self.vocabularies: Vocabularies | None = None  # set by the app (vision/): "vocabulary_id" streams read signs

    # ---- opening -----------------------------------------------------------------------------------------------
    async def open(self, msg: Mapping[str, object], who: Principal) -> Opened:
        if str(msg.get("engine", "batched")) != "batched":  # the per-stream baseline is another service's
            raise InvalidParameter("engine must be one of ['batched', 'per-stream']")  # (stream/front.py)
        self._refuse_if_draining()  # before a resume's claim: a server that will not serve it does not take it over
        snapshot: Mapping[str, object] | None = None
        req: ResumeRequest | None = None
        if msg.get("resume") is not None:
            req = parse_resume(msg["resume"])
            spec = await self.takeovers.resumable(req, who)
        else:
            gid = msg.get("glossary_id")
            terms = await self.glossary_for(who, str(gid)) if gid and self.glossary_for is not None else []
            spec = parse_start(msg, self.executor.registry.mt_route, terms, self.settings.diarize.max_speakers)
            spec.key_id = who.key_id
            # the store is read (and the recogniser built) on a worker thread: it is disk, network and DTW
            vid = msg.get("vocabulary_id")  # most streams name none: no thread hop for them
            spec.vocabulary_id = (await asyncio.to_thread(vocabulary_of, self.vocabularies, vid, who.key_id)
                                  if vid not in (None, "") else "")
            self.supervisor.refuse_if_breached(spec.slo, who.key_id, self.capacity.refused)
        # capacity before the claim: a resume refused for it (or for a drain) has taken nothing over, and the
        # connection still serving the stream, here or elsewhere, keeps it
        held = await self.capacity.hold(spec, spec.key_id or who.key_id)
        try:
            self._refuse_if_draining()  # it may have begun while this open waited on the store or on admission
            if req is not None:
                snapshot = await self.takeovers.take_over(req)
        except BaseException:
            self.capacity.unhold(spec.stream_id, held)
            raise
        trace = None if self.tracer is None else self.tracer.stream(
            spec.stream_id, spec.key_id, spec.slo, spec.source_lang, spec.targets, resumed=snapshot is not None)
        session = StreamSession(spec, self.executor, self, self.settings, log=self.log, resume=snapshot,
                                image_slots=self.image_slots, trace=trace, pixels=self.pixels.of(spec.key_id))
        self.sessions[spec.stream_id] = session  # the session holds the reservation now; released() lets it go
        try:
            ready = await session.open()
            greeting: list[Event] = [ready]
            finished = False
            if msg.get("room") not in (None, False) and self.rooms is not None:  # publish it as a room
                await self.rooms.attach(session, msg["room"], who.key_id, ready, msg.get("room_targets"))
            if snapshot is not None:
                assert req is not None
                greeting += await self.takeovers.replay(req, snapshot)
                if snapshot.get("closed"):
                    greeting.append(Closed(finals=session.seq))
                    finished = True
        except BaseException:
            session.abort()
            raise
        if self.draining and not finished:  # the drain began while this open waited (a resume's claim, the log):
            # a claimed stream is this client's now, so it is not refused (that would leave it unowned) but closed
            # with `draining` (1012: resume elsewhere), as the drain closes every stream here
            session.fail(Draining("the server is shutting down; reconnect to resume this stream"))
        return Opened(session, greeting, finished)

    @property
    def quota(self) -> Quota:
        return self.capacity.quota

    @property
    def breaker(self) -> TenantBreaker:
        return self.supervisor.breaker

    def _refuse_if_draining(self) -> None:
        if self.draining:
            self.capacity.unavailable()
            raise Overloaded("the server is shutting down; connect again shortly", retry_after=2.0, not_serving=True)

    def live_epochs(self) -> dict[str, int]:
        """Each live stream's owner epoch here, for api/takeover.py (``Takeovers.live_epochs``)."""
        return self.takeovers.live_epochs()

    def taken_over(self, stream_id: str, epoch: int) -> bool:
        """Ends the session here of a stream resumed elsewhere, for api/takeover.py (``Takeovers.taken_over``)."""
        return self.takeovers.taken_over(stream_id, epoch)

    # ---- StreamOwner -------------------------------------------------------------------------------------------
    def released(self, session: StreamSession) -> None:
        if session.trace is not None:  # ends once, however the stream ended
            session.trace.end(finals=session.seq, error=session.error.code if session.error else None)
        stream_id = session.spec.stream_id
        if self.sessions.get(stream_id) is not session:
            return  # released already (or replaced by a resumed session)
        del self.sessions[stream_id]
        self.supervisor.forget(stream_id)
        self.capacity.release(stream_id)
        self.pixels.released(session.spec.key_id)

    def degraded(self, slo: str, step: str, key_id: str = "") -> bool:
        return self.supervisor.degraded(slo, step, key_id)

    def caption_done(self, slo: str, seconds: float, key_id: str = "") -> None:
        if self.metrics is not None:
            self.metrics.caption(slo, seconds)
        self.supervisor.record(slo, seconds, "caption", key_id)

    async def revoke(self, key_id: str) -> int:
        """A key was revoked: its live streams end now (``unauthenticated``, 4401). Returns how many."""
        doomed = [s for s in self.sessions.values() if s.spec.key_id == key_id]
        for s in doomed:
            s.fail(AuthenticationError("the API key of this stream was revoked"))
        return len(doomed)

    # ---- ending --------------------------------------------------------------------------------------------------
    async def drain(self, deadline_s: float) -> None:
        """Stop admitting; let every live stream finish its queued commits (logged and sent) within
        ``deadline_s``, then close it with ``draining`` so its client reconnects (here after a restart, or
        elsewhere) and resumes."""
        self.draining = True
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        for s in self.sessions.values():
            s.release_held()
        for _ in range(int(deadline_s / DRAIN_POLL_S) + 1):  # sessions finish on their own: look every 50 ms
            if not any(s.busy() for s in self.sessions.values()) or loop.time() >= end:
                break
            await asyncio.sleep(DRAIN_POLL_S)
        for s in list(self.sessions.values()):
            s.fail(Draining("the server is shutting down; reconnect to resume this stream"))

    async def compact(self) -> dict[str, int]:
        """Log compaction: drop streams past their retention, trim long logs (state/streams.py). The streams live
        here are kept whatever their silence: under ``serve --workers`` every worker compacts and keeps its own, so
        a stream live on another worker stays as long as ``compact_interval_s`` is well under ``retention_s``."""
        if self.log is None:
            return {}
        live = [sid for sid, s in self.sessions.items() if s.journal is not None]
        return await self.log.call(self.log.store.compact, self.settings.state.retention_s,
                                   self.settings.state.max_log_finals, live, wait_s=None)

    async def close(self) -> None:
        """End every live stream here and stop its breaker supervisor's ticker (the supervisor serves this service
        alone: ``BreakerSupervisor.watch``). The engine, the stream log and the rooms were handed in, and whoever
        made them closes them, after this (api/app.py's streams lifetime; a test's own fixture)."""
        for s in list(self.sessions.values()):
            s.abort()
        await self.supervisor.close()
