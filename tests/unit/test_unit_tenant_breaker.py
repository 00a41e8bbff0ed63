"""The breaker per class and per key (stream/tenant_breaker.py): one key missing its target is degraded and
refused on its own, another key meeting it keeps being admitted and undegraded; a class-wide miss still refuses all."""

from __future__ import annotations

from lingua_fusion.stream.breaker import SLOBreaker
from lingua_fusion.stream.tenant_breaker import TenantBreaker

TARGETS = {"interactive": 1.0, "standard": 3.0, "batch": 30.0}


def breaker() -> TenantBreaker:
    return TenantBreaker(lambda: SLOBreaker(dict(TARGETS), window_s=5.0, k=3))


def run(b: TenantBreaker, seconds: float, latencies: dict[str, float], slo: str = "standard") -> list:
    """``seconds`` of captions, one per key per second, each key at its latency; the moves that came of it."""
    moves = []
    for i in range(int(seconds)):
        for key, late in latencies.items():
            moves += b.record(slo, late, 1000.0 + i, "caption", key)
    return moves


def test_one_slow_key_is_refused_and_degraded_and_another_key_is_not() -> None:
    b = breaker()
    moves = run(b, 16, {"A": 27.0, "B": 0.4})  # A's room captions 27 s late, B's 0.4 s: three breached windows
    assert {(m.key_id, m.move.to_level) for m in moves} == {(None, 1), ("A", 1)}  # the class and A; never B
    assert b.level("standard") == 1 and b.keys_down("standard") == ["A"]
    assert b.refusing("standard", "A") == 1
    assert b.refusing("standard", "B") == 0  # the old breaker refused B for A's doing
    assert b.refusing("standard", "C") == 0  # a key new to the class too
    assert b.active("standard", "drop_partials", "A") and not b.active("standard", "drop_partials", "B")
    assert b.refusing("interactive", "A") == 0  # per class: A's other classes are untouched


def test_every_key_slow_is_a_class_wide_miss_that_refuses_everybody() -> None:
    b = breaker()
    run(b, 16, {"A": 5.0, "B": 5.0})
    assert b.keys_down("standard") == ["A", "B"]
    assert b.refusing("standard", "C") == 0  # both are down on their own: a third key is within its share
    # a miss no key's own samples show (stage samples without a key: the model lane of the class) refuses all
    c = breaker()
    for i in range(16):
        c.record("standard", 5.0, 1000.0 + i, "asr", None)
    assert c.level("standard") == 1 and not c.keys_down("standard")
    assert c.refusing("standard", "A") == 1 and c.refusing("standard", "B") == 1
    assert c.active("standard", "drop_partials", "B")


def test_a_key_that_went_quiet_is_forgotten_once_restored() -> None:
    b = breaker()
    run(b, 16, {"A": 27.0})
    assert b.refusing("standard", "A") == 1
    b.tick(1000.0 + 16 + 70)  # quiet for over a minute: restored, then dropped from the map
    assert b.refusing("standard", "A") == 0 and b.level("standard") == 0
    b.tick(1000.0 + 16 + 200)
    assert "A" not in b.keys


def test_an_operators_restore_clears_the_class_and_every_key() -> None:
    b = breaker()
    run(b, 16, {"A": 27.0, "B": 0.4})
    moves = b.restore(1016.0)
    assert {(m.key_id, m.move.from_level, m.move.to_level) for m in moves} == {(None, 1, 0), ("A", 1, 0)}
    assert b.refusing("standard", "A") == 0 and b.keys_down("standard") == []
