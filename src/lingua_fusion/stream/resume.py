"""A resume, both halves: taking the stream over, then going on from where its log ends.

A resume is a take-over: the stream may still be live, here or on another worker process or server sharing the
stream store, and one session alone may own it. ``Takeovers`` is the resume's part of ``StreamService.open``:
``resumable`` reads the stream (only the key that opened it, or an admin key, may resume it) and claims nothing, so a
resume refused next for capacity or a drain has taken nothing over; ``take_over`` claims it (its owner epoch goes up:
the older session here ends ``taken_over`` now, one elsewhere at its next write or at api/takeover.py's next look,
which ``live_epochs`` and ``taken_over`` serve); ``replay`` gives the finals the client missed, exactly once and in
order. It ends sessions but registers, releases and holds capacity for none: that is the service's. The new session
goes on from the claimed snapshot (stream/journal.py, written as finals are logged) read into a ``ResumePoint``.
Sessions are seen through ``LiveSession``: stream/session.py imports this module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidParameter, LinguaFusionError, PermissionDenied, TakenOver
from .capacity import Principal
from .events import Error, Event, Logged
from .journal import Journal, StreamLog
from .protocol import ResumeRequest, StreamSpec
from .stored import number as _number
from .wire import ResumedJSON


@dataclass(frozen=True)
class ResumePoint:
    last_seq: int  # the last final logged: numbering goes on from it
    text_until: float  # re-sent text at or before this stream time was logged already
    committed_until: float  # stream seconds committed: the client re-sends audio after them
    origin: float | None  # the stream clock's origin on the media clock, when it was fixed
    epoch: int = 0  # the owner epoch this resume claimed (state/streams.py): the session's writes carry it

    @classmethod
    def of(cls, snap: Mapping[str, object]) -> ResumePoint:
        origin = snap.get("origin")
        return cls(last_seq=int(_number(snap.get("last_seq", 0))),
                   text_until=float(_number(snap.get("text_until", -1.0))),
                   committed_until=float(_number(snap.get("committed_until", 0.0))),
                   origin=float(_number(origin)) if origin is not None else None,
                   epoch=int(_number(snap.get("epoch", 0))))

    def resumed(self) -> ResumedJSON:
        """The ``ready`` event's ``resumed``: the last seq, where to re-send from (stream and media time)."""
        until = self.committed_until
        return {"last_seq": self.last_seq, "resume_from": round(until, 3),
                "resume_from_ts": round(until + self.origin, 3) if self.origin is not None else None}


TAKEN = "this stream was resumed by another connection; this one is closed"


class LiveSession(Protocol):
    """A live stream's session as a take-over sees it (stream/session.py ``StreamSession``)."""

    @property
    def journal(self) -> Journal | None: ...  # None: the engine keeps no stream log

    def fail(self, error: LinguaFusionError) -> None: ...


class Takeovers:
    """``log``: the stream log (None: streams cannot be resumed); ``sessions``: the service's live sessions by
    stream id, read here, never changed (a session ended here leaves it through ``StreamOwner.released``)."""

    def __init__(self, log: StreamLog | None, sessions: Mapping[str, LiveSession]) -> None:
        self.log = log
        self.sessions = sessions

    async def resumable(self, req: ResumeRequest, who: Principal) -> StreamSpec:
        """The stream ``req`` names, if ``who`` may resume it (read only: nothing is claimed yet)."""
        if self.log is None:
            raise InvalidParameter("this engine keeps no stream log: streams cannot be resumed")
        spec = await self._snapshot(req)
        if spec.key_id != who.key_id and not who.admin:
            # the token alone is not enough: a stream's captions belong to the key that opened it
            raise PermissionDenied("this stream was opened with another API key; only that key can resume it")
        return spec

    async def take_over(self, req: ResumeRequest) -> Mapping[str, object]:
        """Claim the stream (its capacity is held already); the snapshot to go on from."""
        assert self.log is not None
        old = self.sessions.get(req.stream_id)
        if old is not None:
            # the client saw the break before this server did (or another connection holds the stream): end the
            # old session, saying so, and let its last finals reach the log (its reservation stays: this open
            # holds it too)
            old.fail(TakenOver(TAKEN))
            await self.log.settled(req.stream_id)
        # take the stream over in the store (its owner epoch goes up): a session of it on another worker process
        # or server is refused its next write and ends taken_over; the snapshot is read in the same transaction,
        # so nothing logged before is numbered twice
        snapshot: Mapping[str, object] = await self.log.call(self.log.store.claim, req.stream_id, req.resume_token)
        self._displace(req.stream_id, int(_number(snapshot.get("epoch", 0))))
        if req.last_seq > int(_number(snapshot.get("last_seq", 0))):
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
        taken = TakenOver(TAKEN)
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

    async def replay(self, req: ResumeRequest, snapshot: Mapping[str, object]) -> list[Event]:
        """The finals logged after the client's ``last_seq`` (the snapshot's ``log_from`` is the first kept)."""
        assert self.log is not None
        last_seq, log_from = req.last_seq, int(_number(snapshot.get("log_from", 1)))
        out: list[Event] = []
        if last_seq + 1 < log_from:  # compaction dropped finals this client never saw: say so
            out.append(Error("log_compacted", f"finals {last_seq + 1}..{log_from - 1} are past the log's retention "
                                              "and cannot be replayed"))
        logged = await self.log.finals_after(req.stream_id, last_seq)
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
        session.fail(TakenOver(TAKEN))
        return True
