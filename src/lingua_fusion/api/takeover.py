"""A live stream resumed on another process learns it within a second, not at its next caption.

A resume claims the stream in the shared store (its owner epoch goes up: state/streams.py ``claim``). A session of
the same stream in this process is ended at once (``StreamService._resume``); one in another worker of ``serve
--workers N``, or in another server on the same store, found out only when its next caption was refused, and a
session whose client had moved on sends no more captions, so it held its connection and quota until the idle
timeout. This watch asks the store, every ``interval_s``, for the epochs of the streams live here (one read, in a
thread) and ends each session whose epoch is behind (``taken_over``, close 4409), as a local resume does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass

from .watch import every


@dataclass(frozen=True)
class TakeoverWatch:
    """``live``: stream id -> the epoch its session here writes with; ``epochs``: the store's (blocking: run in a
    thread); ``end``: ends that stream's session here if it still writes with that epoch (True when it did)."""

    live: Callable[[], dict[str, int]]
    epochs: Callable[[Collection[str]], dict[str, int]]
    end: Callable[[str, int], bool]
    interval_s: float
    timeout_s: float = 10.0  # one store read

    async def check(self) -> int:
        """One look: end the sessions taken over elsewhere; how many."""
        live = self.live()
        if not live:
            return 0
        now = await asyncio.wait_for(asyncio.to_thread(self.epochs, list(live)), self.timeout_s)
        return sum(self.end(sid, epoch) for sid, epoch in live.items() if now.get(sid, epoch) > epoch)

    async def run(self) -> None:
        """``check`` every ``interval_s`` until cancelled (``watch.every``; while it fails, the caption path still
        refuses a stale session's writes)."""
        await every(self.interval_s, self.check, "take-over check", "ended {n} stream session(s) resumed elsewhere")
