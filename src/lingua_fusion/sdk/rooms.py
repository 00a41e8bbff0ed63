"""Listening to a room from Python: ``for event in translator.listen(room_id, token=..., targets=["es"]):``.

The listener connects to ``WS /v1/rooms/{id}/listen`` with its read-only token in the Authorization header. When
the connection breaks (or the server dropped it as a slow listener, 4429) it reconnects with ``after_seq`` = the
last final it gave, so every final arrives exactly once, in order, until ``closed``. A refusal (bad token 4401,
unknown language 4422, ...) raises the typed error with the server's code.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import urlencode

from ..errors import BackendError
from .common import error_of
from .stream import StreamEvent

log = logging.getLogger("lingua_fusion.sdk")

RETRY_CODES = {1001, 1006, 1011, 1012, 4429}  # going away, broken, server error, restart, dropped as slow


def listen_url(base_url: str, room_id: str, targets: list[str], after_seq: int, speech: bool) -> str:
    scheme, _, rest = base_url.partition("://")
    query = urlencode({"targets": ",".join(targets), "after_seq": after_seq, "speech": str(speech).lower()})
    return ("wss" if scheme == "https" else "ws") + "://" + rest.rstrip("/") + f"/v1/rooms/{room_id}/listen?{query}"


class _State:
    def __init__(self, after_seq: int, reconnect_timeout: float,
                 on_break: Callable[[float], None] | None = None) -> None:
        self.last_seq = after_seq
        self.reconnects = 0
        self.deadline = 0.0  # while reconnecting: when to give up; 0 while the connection works
        self.reconnect_timeout = reconnect_timeout
        self.on_break = on_break
        self.error: dict[str, object] | None = None  # the error event before a refusal's close

    def event(self, raw: str | bytes) -> StreamEvent | None:
        """The event to give, or None (a final already given before a reconnection)."""
        self.deadline = 0.0  # working again once an event came (an accept then a close is still one break)
        ev = StreamEvent.model_validate(json.loads(raw))
        if ev.type == "final" and ev.seq is not None:
            if ev.seq <= self.last_seq:
                return None
            self.last_seq = ev.seq
        if ev.type == "error":
            self.error = ev.model_dump()
        return ev

    def broken(self, code: int | None) -> float:
        """Seconds to wait before reconnecting; raises when the break is final (a refusal, or past the deadline)."""
        if code is not None and code not in RETRY_CODES:
            raise error_of(self.error or {}, f"the room closed the connection ({code})")
        now = time.monotonic()
        if not self.deadline:  # the first retry since the connection last worked: a new break
            self.deadline = now + self.reconnect_timeout
            self._announce()
        if now > self.deadline:
            raise BackendError("lost the room's connection and could not reconnect")
        self.error = None
        self.reconnects += 1
        return min(2.0, 0.25 * 2 ** min(self.reconnects, 3))

    def _announce(self) -> None:
        if self.on_break is None:
            return
        try:
            self.on_break(self.reconnect_timeout)
        except Exception:  # a caller's notice must not end the listener
            log.exception("listen: on_break failed")


def listen(base_url: str, room_id: str, token: str, targets: list[str], *, after_seq: int = 0, speech: bool = False,
           reconnect_timeout: float = 60.0, open_timeout: float = 30.0,
           on_break: Callable[[float], None] | None = None) -> Iterator[StreamEvent]:
    """The room's events (partials, finals, slides, closed) for ``targets``, blocking; ends after ``closed``.
    ``on_break(seconds)``: called when a working connection breaks and reconnecting starts (for at most
    ``seconds``), so a program can say so instead of going quiet."""
    from websockets.exceptions import ConnectionClosed, WebSocketException
    from websockets.sync.client import connect

    st = _State(after_seq, reconnect_timeout, on_break)
    while True:
        code: int | None = None
        try:
            with connect(listen_url(base_url, room_id, targets, st.last_seq, speech), open_timeout=open_timeout,
                         additional_headers={"Authorization": f"Bearer {token}"}, max_size=16 * 1024 * 1024) as ws:
                for raw in ws:
                    ev = st.event(raw)
                    if ev is not None and ev.type != "error":
                        yield ev
                        if ev.type == "closed":
                            return
                code = ws.close_code
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
        except (OSError, WebSocketException, TimeoutError) as exc:
            if not st.deadline and st.reconnects == 0:
                raise BackendError(f"cannot reach the room at {base_url}: {exc}") from exc
        time.sleep(st.broken(code))


async def alisten(base_url: str, room_id: str, token: str, targets: list[str], *, after_seq: int = 0,
                  speech: bool = False, reconnect_timeout: float = 60.0, open_timeout: float = 30.0,
                  on_break: Callable[[float], None] | None = None) -> AsyncIterator[StreamEvent]:
    """``listen`` for asyncio."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, WebSocketException

    st = _State(after_seq, reconnect_timeout, on_break)
    while True:
        code: int | None = None
        try:
            async with connect(listen_url(base_url, room_id, targets, st.last_seq, speech),
                               open_timeout=open_timeout, additional_headers={"Authorization": f"Bearer {token}"},
                               max_size=16 * 1024 * 1024) as ws:
                async for raw in ws:
                    ev = st.event(raw)
                    if ev is not None and ev.type != "error":
                        yield ev
                        if ev.type == "closed":
                            return
                code = ws.close_code
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
        except (OSError, WebSocketException, TimeoutError) as exc:
            if not st.deadline and st.reconnects == 0:
                raise BackendError(f"cannot reach the room at {base_url}: {exc}") from exc
        await asyncio.sleep(st.broken(code))
