"""The StreamService: the one owner of live streams, used by the WebSocket route and by in-process streams alike.

``open`` runs the whole ceremony of a stream's start (auth is the caller's): parse the start message (or the resume
request: only the key that opened the stream, or an admin key, may resume it), drain check, capacity (per-key quota
and admission), then for a resume the take-over (an older session of the same stream ends with ``taken_over``, here
or on another worker process or server sharing the stream store: the resume claims the stream's owner epoch, and the
old session's next write is refused), registration, the ``ready`` event, and for a resume the finals the client
missed (exactly once, in order) with a notice when compaction dropped some. Capacity comes before the claim, so a
resume refused for capacity or for a drain has taken nothing over; and a stream holds one reservation here however
many connections take it over in turn (``_Hold``), so a takeover of a stream live here needs no capacity of its own.
``drain`` ends every stream for a shutdown. Two parts do the rest, each a module of its own: ``StreamCapacity``
(stream/capacity.py: the key's quota and the engine's admission, one reservation per stream, refusals counted) and
``BreakerSupervisor`` (stream/supervisor.py: the SLO breakers, which hear every caption's latency through the
service as StreamOwner and every committed model stage's from the engine directly, and their notices, thinning and
shedding). The supervisor is made by whoever builds the engine and given to both: to the engine's constructor as
its StageObserver (``observer=``), and here (``supervisor=``), where it is bound to this service's live streams and
its engine's clock; the service never touches the engine's wiring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..config import Settings
from ..errors import (
    AuthenticationError,
    Draining,
    InvalidParameter,
    Overloaded,
    PermissionDenied,
    TakenOver,
)
from ..glossary import Term
from ..serving.engine import Engine
from ..tracing import Tracer
from .budget import PixelBudget, pixel_budget
from .capacity import KeyQuota, Principal, StreamCapacity
from .contracts import Slots, Vocabularies
from .events import Closed, Error, Event, Logged, Ready
from .journal import StreamLog
from .protocol import ResumeRequest, StreamSpec, parse_resume, parse_start
from .quota import Quota
from .session import StreamSession
from .stored import number
from .supervisor import BreakerSupervisor
from .tenant_breaker import TenantBreaker

if TYPE_CHECKING:
    from ..observability import Metrics

log = logging.getLogger("lingua_fusion.streams")
DRAIN_POLL_S = 0.05


class RoomHost(Protocol):
    """Where a stream started with ``"room": true`` (or a room id made by REST) is published (rooms/service.py)."""

    async def attach(self, session: StreamSession, room: object, key_id: str, ready: Ready,
                     room_targets: object = None) -> None:
        """Publish ``session`` as a room (a resumed stream re-attaches to its room); fills the ready event's
        ``room_id``, ``listener_token`` and ``listener_token_id``. ``room`` and ``room_targets`` are the start
        message's, unchecked: ``room`` is true or a room id, ``room_targets`` the languages the room's listeners may
        add to the stream's own targets. Raises a client error for a value that is neither, or a room that is not
        this key's."""
        ...

    async def close(self) -> None: ...


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
        self._pixels: dict[str, PixelBudget] = {}  # key id -> the pixels its live streams may decode (budget.py)
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
            spec = await self._resumable(req, who)
        else:
            gid = msg.get("glossary_id")
            terms = await self.glossary_for(who, str(gid)) if gid and self.glossary_for is not None else []
            spec = parse_start(msg, self.executor.registry.mt_route, terms, self.settings.diarize.max_speakers)
            spec.key_id = who.key_id
            # the store is read (and the recogniser built) on a worker thread: it is disk, network and DTW
            vid = msg.get("vocabulary_id")  # most streams name none: no thread hop for them
            spec.vocabulary_id = await asyncio.to_thread(self._vocabulary, vid, who) if vid not in (None, "") else ""
            self.supervisor.refuse_if_breached(spec.slo, who.key_id, self.capacity.refused)
        # capacity before the claim: a resume refused for it (or for a drain) has taken nothing over, and the
        # connection still serving the stream, here or elsewhere, keeps it
        held = await self.capacity.hold(spec, spec.key_id or who.key_id)
        try:
            self._refuse_if_draining()  # it may have begun while this open waited on the store or on admission
            if req is not None:
                snapshot = await self._take_over(req)
        except BaseException:
            self.capacity.unhold(spec.stream_id, held)
            raise
        trace = None if self.tracer is None else self.tracer.stream(
            spec.stream_id, spec.key_id, spec.slo, spec.source_lang, spec.targets, resumed=snapshot is not None)
        pixels = self._pixels.get(spec.key_id)
        if pixels is None:  # one per key, for all its streams
            pixels = self._pixels[spec.key_id] = pixel_budget(self.settings.limits, time.monotonic)
        session = StreamSession(spec, self.executor, self, self.settings, log=self.log, resume=snapshot,
                                image_slots=self.image_slots, trace=trace, pixels=pixels)
        self.sessions[spec.stream_id] = session  # the session holds the reservation now; released() lets it go
        try:
            ready = await session.open()
            greeting: list[Event] = [ready]
            finished = False
            if msg.get("room") not in (None, False) and self.rooms is not None:  # publish it as a room
                await self.rooms.attach(session, msg["room"], who.key_id, ready, msg.get("room_targets"))
            if snapshot is not None:
                assert req is not None
                greeting += await self._replay(spec.stream_id, req.last_seq, int(number(snapshot.get("log_from", 1))))
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

    def _vocabulary(self, vid: object, who: Principal) -> str:
        """A start message's ``vocabulary_id``: the opening key's, taught (404 / 400 otherwise), or ""."""
        if vid in (None, ""):
            return ""
        if not isinstance(vid, str):
            raise InvalidParameter("vocabulary_id must be a string (POST /v1/vocabularies)")
        if self.vocabularies is None:
            raise InvalidParameter("this server reads no signs: it has no vocabulary store")
        self.vocabularies.check(who.key_id, vid)  # not found for another key; refused when untaught
        return vid

    async def _resumable(self, req: ResumeRequest, who: Principal) -> StreamSpec:
        """The stream ``req`` names, if ``who`` may resume it (read only: nothing is claimed yet)."""
        if self.log is None:
            raise InvalidParameter("this engine keeps no stream log: streams cannot be resumed")
        spec = await self._snapshot(req)
        if spec.key_id != who.key_id and not who.admin:
            # the token alone is not enough: a stream's captions belong to the key that opened it
            raise PermissionDenied("this stream was opened with another API key; only that key can resume it")
        return spec

    async def _take_over(self, req: ResumeRequest) -> Mapping[str, object]:
        """Claim the stream (its capacity is held already); the snapshot to go on from."""
        assert self.log is not None
        old = self.sessions.get(req.stream_id)
        if old is not None:
            # the client saw the break before this server did (or another connection holds the stream): end the
            # old session, saying so, and let its last finals reach the log (its reservation stays: this open
            # holds it too)
            old.fail(TakenOver("this stream was resumed by another connection; this one is closed"))
            await self.log.settled(req.stream_id)
        # take the stream over in the store (its owner epoch goes up): a session of it on another worker process
        # or server is refused its next write and ends taken_over; the snapshot is read in the same transaction,
        # so nothing logged before is numbered twice
        snapshot: Mapping[str, object] = await self.log.call(self.log.store.claim, req.stream_id, req.resume_token)
        self._displace(req.stream_id, int(number(snapshot.get("epoch", 0))))
        if req.last_seq > int(number(snapshot.get("last_seq", 0))):
            # the server died holding finals it had sent but not logged (the log was down): number on from what
            # the client has, so no seq is reused; their audio, re-sent from committed_until, is transcribed again
            snapshot = {**snapshot, "last_seq": req.last_seq}
        return snapshot

    def _displace(self, stream_id: str, epoch: int) -> None:
        """After the claim: a session of this stream that a concurrent resume registered here while this one waited
        on the store (two reconnects of one client) holds another epoch. The newer claim keeps the stream, the older
        one ends ``taken_over``; without this both went live and the one left out of ``sessions`` kept its quota
        (both hold the stream's one reservation, ``StreamCapacity.hold``: the loser lets go of it as it ends)."""
        current = self.sessions.get(stream_id)
        if current is None:
            return
        taken = TakenOver("this stream was resumed by another connection; this one is closed")
        if current.journal is not None and current.journal.epoch > epoch:
            raise taken
        current.fail(taken)

    async def _snapshot(self, req: ResumeRequest) -> StreamSpec:
        assert self.log is not None
        await self.log.settled(req.stream_id)  # a closed session's last finals first
        snapshot: Mapping[str, object] = await self.log.call(self.log.store.resume, req.stream_id, req.resume_token)
        spec = snapshot["spec"]
        if not isinstance(spec, Mapping):
            raise TypeError(f"the stream log holds {type(spec).__name__} where a stream's spec belongs")
        return StreamSpec.from_dict(spec, req.stream_id, req.resume_token)

    async def _replay(self, stream_id: str, last_seq: int, log_from: int) -> list[Event]:
        assert self.log is not None
        out: list[Event] = []
        if last_seq + 1 < log_from:  # compaction dropped finals this client never saw: say so
            out.append(Error("log_compacted", f"finals {last_seq + 1}..{log_from - 1} are past the log's retention "
                                              "and cannot be replayed"))
        logged = await self.log.finals_after(stream_id, last_seq)
        out += [Logged(e) for e in logged if int(e["seq"]) > last_seq]  # exactly once, in order
        return out

    def live_epochs(self) -> dict[str, int]:
        """Each live stream's owner epoch here (streams with a journal), for api/takeover.py."""
        return {sid: s.journal.epoch for sid, s in self.sessions.items() if s.journal is not None}

    def taken_over(self, stream_id: str, epoch: int) -> bool:
        """The store says ``stream_id`` was resumed elsewhere after its session here claimed ``epoch``: that session,
        if it is still the one here, ends ``taken_over`` (4409). True when it did."""
        session = self.sessions.get(stream_id)
        if session is None or session.journal is None or session.journal.epoch != epoch:
            return False
        session.fail(TakenOver("this stream was resumed by another connection; this one is closed"))
        return True

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
        key_id = session.spec.key_id
        if not any(s.spec.key_id == key_id for s in self.sessions.values()):
            self._pixels.pop(key_id, None)  # the key's last stream: its budget goes (bounded by live keys)

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
