"""How much audio a stream may feed: a token bucket of audio seconds (a pure core; the clock is passed in).

A live source speaks at 1x real time. A client may send faster (a file played as a stream, a reconnect catching up),
but every second it sends costs decode, VAD and ASR work that the other streams wait behind. So each stream has a
bucket of ``burst_s`` audio seconds, refilled at ``speed`` x real time:

- a message carrying more than ``burst_s`` seconds is refused before any work (``TooLarge``: it could never be paid);
- a message the bucket cannot pay now is paid in debt, and the reader waits until the debt is paid back before it
  reads the next message (at most ``burst_s / speed`` seconds). The client is slowed by TCP, as a live source
  would be; it is told once, by an ``audio_paced`` error event that does not end the stream.

Defaults (``limits.max_audio_speed`` 4, ``limits.max_audio_burst_s`` 30): a file of up to 30 s goes in at once, a
longer one at 4x real time; an attacker's 131 s message is refused, and back-to-back 30 s messages cost the others
at most one 30 s message's work every 7.5 s per stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import TooLarge
from .events import Error

PACED_CODE = "audio_paced"


def check_message(seconds: float, burst_s: float) -> None:
    """Refuse one message of more than ``burst_s`` audio seconds, before any work is done on it."""
    if seconds > burst_s + 1e-9:
        raise TooLarge(f"one message carries {seconds:.1f} s of audio; at most {burst_s:g} s (send audio in smaller "
                       "pieces)", details={"limit": "max_audio_burst_s", "seconds": round(seconds, 3)})


@dataclass
class AudioBudget:
    speed: float  # audio seconds per wall second, averaged
    burst_s: float  # audio seconds the bucket holds, and the most one message may carry
    clock: Callable[[], float]
    tokens: float = field(init=False)
    paced: int = field(default=0, init=False)  # messages that had to wait
    _t: float = field(init=False)
    _told: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.tokens, self._t = self.burst_s, self.clock()

    def charge(self, seconds: float) -> float:
        """Pay for ``seconds`` of audio: how long (wall seconds) the reader must wait before its next message."""
        check_message(seconds, self.burst_s)
        now = self.clock()
        self.tokens = min(self.burst_s, self.tokens + (now - self._t) * self.speed) - seconds
        self._t = now
        if self.tokens >= 0:
            return 0.0
        self.paced += 1
        return -self.tokens / self.speed

    def notice(self) -> Error | None:
        """The event a stream is sent the first time it is paced (None otherwise)."""
        if not self.paced or self._told:
            return None
        self._told = True
        return Error(PACED_CODE, f"audio arrives faster than {self.speed:g}x real time: this stream's reads are "
                     "paced (nothing is dropped)", {"limit": "max_audio_speed", "speed": self.speed,
                                                    "burst_s": self.burst_s})
