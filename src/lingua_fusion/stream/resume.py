"""Where a resumed stream continues: its stored snapshot (stream/journal.py, written as finals are logged) read
into a typed ``ResumePoint``, and the ``resumed`` part of its ``ready`` event (what the client re-sends from)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
