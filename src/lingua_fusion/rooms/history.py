"""What a joining listener is sent before the live events: a notice when the room's history no longer holds every
final it asked for, and the room's end when it has ended (pure)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .bus import RoomEvent, seq_of
from .feed import Outgoing
from .model import Room


def gap_notice(after_seq: int, history: Sequence[RoomEvent]) -> list[Outgoing]:
    """An ``error`` first when the history no longer holds every final after ``after_seq`` (a listener
    reconnecting from further back than the last MAX_FINALS), as a resumed stream is told ``log_compacted``."""
    first = next((seq_of(e) for e in history if e.get("type") == "final"), None)
    if after_seq <= 0 or first is None or first <= after_seq + 1:
        return []
    notice = {"type": "error", "code": "log_compacted",
              "message": f"finals {after_seq + 1}..{first - 1} are past the room's history and cannot be replayed"}
    return [Outgoing(notice, json.dumps(notice))]


def with_closed(history: list[Outgoing], room: Room) -> list[Outgoing]:
    if history and history[-1].type == "closed":
        return history
    closed = {"type": "closed", "finals": room.finals, "reason": "the room has ended"}
    return [*history, Outgoing(closed, json.dumps(closed))]
