"""How much audio a stream, and how many pixels a key, may feed: token buckets (a pure core; the clock is passed in).

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

Pictures cost by their pixels (decode, the copy to a model process, OCR): each key has one ``PixelBudget`` for all
its streams (``limits.max_key_pixels_per_s``, 16 MP/s, bursts of one largest image): an image or frame is sized
from its header and paid before it is decoded; beyond the budget the stream's reads wait.

``pay`` is the one way a stream pays either: charge, tell the client once, wait out the debt (the sleep is passed
in; the buckets themselves never wait).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..config import LimitSettings
from ..errors import TooLarge
from .events import Error

PACED_CODE = "audio_paced"
PICTURES_PACED_CODE = "pictures_paced"


def check_message(seconds: float, burst_s: float) -> None:
    """Refuse one message of more than ``burst_s`` audio seconds, before any work is done on it."""
    if seconds > burst_s + 1e-9:
        raise TooLarge(f"one message carries {seconds:.1f} s of audio; at most {burst_s:g} s (send audio in smaller "
                       "pieces)", details={"limit": "max_audio_burst_s", "seconds": round(seconds, 3)})


@dataclass
class Bucket:
    """A token bucket of ``burst`` units refilled at ``rate`` units per wall second; a charge the bucket cannot pay
    now is paid in debt, and ``charge`` returns how long to wait before the next one."""

    rate: float
    burst: float
    clock: Callable[[], float]
    tokens: float = field(init=False)
    paced: int = field(default=0, init=False)  # charges that had to wait
    _t: float = field(init=False)
    _told: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.tokens, self._t = self.burst, self.clock()

    def charge(self, units: float) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self._t) * self.rate) - units
        self._t = now
        if self.tokens >= 0:
            return 0.0
        self.paced += 1
        return -self.tokens / self.rate

    def first_pace(self) -> bool:
        """True once: the first time a charge had to wait (so the client is told once)."""
        if not self.paced or self._told:
            return False
        self._told = True
        return True


class AudioBudget(Bucket):
    """A stream's audio seconds: ``rate`` is its speed (x real time), ``burst`` the most one message may carry."""

    def __init__(self, speed: float, burst_s: float, clock: Callable[[], float]) -> None:
        super().__init__(speed, burst_s, clock)

    @property
    def speed(self) -> float:
        return self.rate

    @property
    def burst_s(self) -> float:
        return self.burst

    def charge(self, units: float) -> float:
        """Pay for ``units`` seconds of audio: how long (wall seconds) the reader must wait before its next
        message."""
        check_message(units, self.burst)
        return super().charge(units)

    def notice(self) -> Error | None:
        """The event a stream is sent the first time it is paced (None otherwise)."""
        if not self.first_pace():
            return None
        return Error(PACED_CODE, f"audio arrives faster than {self.rate:g}x real time: this stream's reads are "
                     "paced (nothing is dropped)", {"limit": "max_audio_speed", "speed": self.rate,
                                                    "burst_s": self.burst})


class PixelBudget(Bucket):
    """A key's decoded pixels (images and video frames of all its streams), per wall second. One picture is
    bounded by ``limits.max_image_pixels`` before this (the burst is at least that, so one always fits)."""

    def notice(self) -> Error | None:
        if not self.first_pace():
            return None
        return Error(PICTURES_PACED_CODE, f"pictures arrive faster than {self.rate / 1e6:g} megapixels a second "
                     "for this key: this stream's reads are paced",
                     {"limit": "max_key_pixels_per_s", "pixels_per_s": self.rate})


def pixel_budget(limits: LimitSettings, clock: Callable[[], float]) -> PixelBudget:
    """A key's pixel budget: ``max_key_pixels_per_s``, in bursts of at least one largest image."""
    rate = limits.max_key_pixels_per_s
    return PixelBudget(rate, max(rate, float(limits.max_image_pixels)), clock)


class Paced(Protocol):
    """A budget a stream pays: ``AudioBudget`` or ``PixelBudget``."""

    def charge(self, units: float) -> float: ...

    def notice(self) -> Error | None: ...


async def pay(budget: Paced, units: float, emit: Callable[[Error], None],
              sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
    """Charge ``units`` to ``budget`` (an ``AudioBudget`` refuses a message over its burst here, ``TooLarge``,
    before any work); the first time a charge has to wait the stream is told (``emit``, once), and the caller,
    the stream's reader, waits out the debt here (``sleep``: ``asyncio.sleep``, looked up when it waits)."""
    wait = budget.charge(units)
    if (notice := budget.notice()) is not None:
        emit(notice)
    if wait > 0:
        await (sleep or asyncio.sleep)(wait)
