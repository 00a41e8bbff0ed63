"""When may a crashed worker process start again? A pure core, the clock passed in (tested without processes).

- After a crash the next start waits ``backoff_s[n - 1]`` for the n-th crash in a row (the last value repeats):
  the first restart is at once, so one crash costs only the work that was in flight.
- ``loop_crashes`` crashes within ``loop_window_s`` are a crash loop: the worker is ``UNAVAILABLE`` for
  ``cooldown_s`` (calls fail at once with the reason, nothing is started), then one start is tried again. Its
  crash history is forgotten then, so a worker that works again is ``READY`` and one that does not trips again
  after ``loop_crashes`` more crashes.
- A request answered resets the run of crashes (the backoff), not the crash-loop window.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from enum import IntEnum


class WorkerState(IntEnum):
    READY = 0  # may start (or is running)
    BACKOFF = 1  # crashed: the next start waits a little
    UNAVAILABLE = 2  # crash loop: no start until the cool-down ends


@dataclass(frozen=True)
class Verdict:
    state: WorkerState
    wait_s: float = 0.0  # BACKOFF / UNAVAILABLE: how long until a start is allowed
    reason: str = ""


@dataclass
class RestartPolicy:
    loop_crashes: int = 3
    loop_window_s: float = 60.0
    cooldown_s: float = 30.0
    backoff_s: tuple[float, ...] = (0.0, 0.5, 2.0, 5.0)
    crashes: int = 0  # every crash seen (what /metrics counts as restarts once the worker is started again)
    last_cause: str = ""
    _recent: collections.deque[float] = field(default_factory=collections.deque)
    _in_a_row: int = 0
    _last_crash_at: float | None = None
    _unavailable_until: float | None = None

    def crashed(self, now: float, cause: str) -> None:
        """The worker died or was killed for missing a deadline; ``cause`` says how ("SIGSEGV", "timeout")."""
        if self._cooled(now):  # the cool-down ended before this crash: the old history is forgotten
            self._unavailable_until = None
            self._recent.clear()
            self._in_a_row = 0
        self.crashes += 1
        self._in_a_row += 1
        self._last_crash_at = now
        self.last_cause = cause
        self._recent.append(now)
        while self._recent and self._recent[0] < now - self.loop_window_s:
            self._recent.popleft()
        if len(self._recent) >= self.loop_crashes:
            self._unavailable_until = now + self.cooldown_s

    def answered(self) -> None:
        self._in_a_row = 0

    def verdict(self, now: float) -> Verdict:
        """May the worker start now? A read: /readyz asks it as often as a call does."""
        if self._unavailable_until is not None:
            if now < self._unavailable_until:
                return Verdict(WorkerState.UNAVAILABLE, self._unavailable_until - now,
                               f"crashed {len(self._recent)} times within {self.loop_window_s:g} s "
                               f"(last: {self.last_cause}); tried again in {self._unavailable_until - now:.0f} s")
            return Verdict(WorkerState.READY)  # the cool-down is over: one more try
        if self._in_a_row and self._last_crash_at is not None:
            wait = self.backoff_s[min(self._in_a_row, len(self.backoff_s)) - 1] - (now - self._last_crash_at)
            if wait > 0:
                return Verdict(WorkerState.BACKOFF, wait, f"restarting after a crash ({self.last_cause})")
        return Verdict(WorkerState.READY)

    def _cooled(self, now: float) -> bool:
        return self._unavailable_until is not None and now >= self._unavailable_until
