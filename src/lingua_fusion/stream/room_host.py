"""What a stream started with ``"room"`` is published through: the face rooms/ implements (rooms/service.py
``RoomService``) and the app hands the StreamService (``StreamService.rooms``), so stream/ never imports rooms/."""

from __future__ import annotations

from typing import Protocol

from .events import Ready
from .session import StreamSession


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
