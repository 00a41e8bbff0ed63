"""The SLO breaker per class *and* per key (pure: time is passed in), so one key's slow work degrades and refuses
that key, not everybody.

Every sample goes to two ``SLOBreaker``s: the class's (as before) and its key's own (one per key that has sent
samples; dropped once it is quiet and at level 0). What follows from their levels:

- **Refusing a new stream** of key K in class C: K's own breaker for C is down (K misses its target), or C's is
  down and no key's breaker for C is (a class-wide problem: every key's new streams wait). While some key is down,
  C's level is that key's doing, and K, which meets its target, is still admitted.
- **Degrading** (drop partials, lower frame rate, ... shed): a stream of key K in class C applies a step when K's
  own breaker has it, or when C's breaker has it and no key of C is down.

The attack this answers (issue 29): one key's room stream of 1,900-character captions in four languages ran 27 s
late, moved the shared ``standard`` class to level 3, and every other key's new streams were refused for a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .breaker import STEPS, SLOBreaker, Transition


@dataclass(frozen=True)
class KeyedTransition:
    """A breaker's move: of the class (``key_id`` None) or of one key's streams of the class."""

    move: Transition
    key_id: str | None


class TenantBreaker:
    def __init__(self, make: Callable[[], SLOBreaker]) -> None:
        self._make = make
        self.classes = make()
        self.keys: dict[str, SLOBreaker] = {}
        self._last: dict[str, float] = {}  # key -> when it last sent a sample

    def record(self, slo: str, latency_s: float, now: float, stage: str, key_id: str | None) -> list[KeyedTransition]:
        out = [KeyedTransition(t, None) for t in self.classes.record(slo, latency_s, now, stage)]
        if key_id:
            breaker = self.keys.get(key_id)
            if breaker is None:
                breaker = self.keys[key_id] = self._make()
            self._last[key_id] = now
            out += [KeyedTransition(t, key_id) for t in breaker.record(slo, latency_s, now, stage)]
        return out

    def tick(self, now: float) -> list[KeyedTransition]:
        out = [KeyedTransition(t, None) for t in self.classes.tick(now)]
        for key_id, breaker in list(self.keys.items()):
            out += [KeyedTransition(t, key_id) for t in breaker.tick(now)]
            quiet = now - self._last.get(key_id, now) > breaker.quiet_s
            if quiet and not any(breaker.level(slo) for slo in breaker.targets):
                del self.keys[key_id]  # nothing to remember: the map holds only keys with recent traffic
                self._last.pop(key_id, None)
        return out

    def restore(self, now: float) -> list[KeyedTransition]:
        """Every breaker, the classes' and each key's, back to level 0 (``SLOBreaker.restore``)."""
        out = [KeyedTransition(t, None) for t in self.classes.restore(now)]
        for key_id, breaker in self.keys.items():
            out += [KeyedTransition(t, key_id) for t in breaker.restore(now)]
        return out

    def key_level(self, slo: str, key_id: str) -> int:
        breaker = self.keys.get(key_id)
        return breaker.level(slo) if breaker is not None else 0

    def keys_down(self, slo: str) -> list[str]:
        return [k for k, b in self.keys.items() if b.level(slo)]

    def refusing(self, slo: str, key_id: str) -> int:
        """The level that refuses key ``key_id``'s new stream of class ``slo`` (0: admitted)."""
        own = self.key_level(slo, key_id)
        if own:
            return own
        level = self.classes.level(slo)
        return level if level and not self.keys_down(slo) else 0

    def effective(self, slo: str, key_id: str) -> int:
        """The level a stream of ``key_id`` in class ``slo`` works at: its key's own, or the class's while no key
        of the class is down on its own."""
        own = self.key_level(slo, key_id)
        return own if own or self.keys_down(slo) else self.classes.level(slo)

    def active(self, slo: str, step: str, key_id: str) -> bool:
        """Does a stream of ``key_id`` in class ``slo`` apply ``step`` now?"""
        return self.effective(slo, key_id) >= STEPS.index(step) + 1

    def level(self, slo: str) -> int:
        return self.classes.level(slo)
