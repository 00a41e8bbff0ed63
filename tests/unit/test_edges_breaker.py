"""Edges of the SLO breaker: exact boundaries, documented defaults, which runs a move resets (stream/breaker.py).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

import pytest

from lingua_fusion.stream.breaker import STEPS, SLOBreaker, Transition


def windows(b: SLOBreaker, slo: str, latencies: list[float], t0: float = 0.0, stage: str = "caption"
            ) -> list[Transition]:
    """One sample per window at the given latencies, each window closed by the next sample (and the last by a tick)."""
    out: list[Transition] = []
    for i, lat in enumerate(latencies):
        out += b.record(slo, lat, t0 + i * b.window_s, stage)
    return out + b.tick(t0 + len(latencies) * b.window_s)


def test_breaker_defaults_are_the_documented_ones() -> None:
    b = SLOBreaker({"standard": 3.0})
    assert (b.window_s, b.k, b.restore_ratio, b.min_samples) == (5.0, 3, 0.8, 1)
    assert b.target("standard", "caption") == 3.0 and b.target("standard", "no-such-stage") == 3.0
    assert SLOBreaker({"standard": 3.0}, stage_share={"mt": 0.3}).target("standard", "mt") == pytest.approx(0.9)


def test_a_window_is_judged_by_its_p99_not_its_worst_sample() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=1.0, k=1)
    for i in range(200):  # 2 outliers in 200 samples: over the p99
        b.record("standard", 10.0 if i < 2 else 1.0, i / 400)
    assert b.tick(1.0) == [] and b.level("standard") == 0


def test_a_window_exactly_at_target_neither_trips_nor_restores() -> None:
    b = SLOBreaker({"x": 5.0}, window_s=1.0, k=2)
    assert windows(b, "x", [5.0, 5.0, 5.0]) == []  # not over the target
    assert [t.to_level for t in windows(b, "x", [6.0, 6.0], t0=10.0)] == [1]
    assert windows(b, "x", [4.0, 4.0, 4.0], t0=20.0) == []  # exactly 0.8 x target: not under it, hold


def test_transitions_carry_their_rounded_p99_and_stage() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    down = windows(b, "x", [3.14159], stage="mt")
    assert down == [Transition("x", 1.0, 0, 1, 3.142, "mt")]
    up = windows(b, "x", [0.123456], t0=10.0)
    assert up == [Transition("x", 11.0, 1, 0, 0.123, "caption")]
    assert b.level("x") == 0


def test_after_a_move_every_run_of_the_class_starts_again() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=3)
    got = windows(b, "x", [2.0] * 9)
    assert [(t.at, t.to_level) for t in got] == [(3.0, 1), (6.0, 2), (9.0, 3)]  # every 3 windows, not every one


def test_a_move_of_one_class_leaves_the_other_classes_runs() -> None:
    b = SLOBreaker({"a": 1.0, "b": 1.0}, window_s=1.0, k=3)
    out = []
    for i in range(4):  # a breaches from window 0, b from window 1: a moves after window 2, b after window 3
        out += b.record("a", 2.0, float(i))
        out += b.record("b", 2.0 if i >= 1 else 0.5, float(i))
    out += b.tick(4.0)
    assert [(t.slo, t.at, t.to_level) for t in out] == [("a", 3.0, 1), ("b", 4.0, 1)]


def test_a_breached_window_resets_the_healthy_run() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=3)
    windows(b, "x", [2.0] * 3)
    assert b.level("x") == 1
    # healthy, healthy, breached, healthy, healthy: never 3 healthy windows in a row
    assert windows(b, "x", [0.1, 0.1, 2.0, 0.1, 0.1], t0=10.0) == []
    assert [t.to_level for t in windows(b, "x", [0.1], t0=15.0)] == [0]


def test_a_window_between_restore_and_target_breaks_both_runs() -> None:
    b = SLOBreaker({"x": 5.0}, window_s=1.0, k=3)
    assert windows(b, "x", [6.0, 6.0, 4.5, 6.0, 6.0]) == []  # 4.5: between 4.0 and 5.0, the run starts again
    windows(b, "x", [6.0], t0=5.0)
    assert b.level("x") == 1
    assert windows(b, "x", [1.0, 1.0, 4.5, 1.0, 1.0], t0=10.0) == []
    assert [t.to_level for t in windows(b, "x", [1.0], t0=15.0)] == [0]


def test_the_last_step_is_the_floor() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    got = windows(b, "x", [2.0] * (len(STEPS) + 3))
    assert [t.to_level for t in got] == list(range(1, len(STEPS) + 1))
    assert b.level("x") == len(STEPS)


def test_restore_goes_one_step_at_a_time() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=1)
    windows(b, "x", [2.0, 2.0])
    assert [t.to_level for t in windows(b, "x", [0.1, 0.1, 0.1], t0=10.0)] == [1, 0]


def test_after_a_restore_the_next_one_needs_k_healthy_windows_again() -> None:
    b = SLOBreaker({"x": 1.0}, window_s=1.0, k=2)
    windows(b, "x", [2.0] * 4)
    assert b.level("x") == 2
    got = windows(b, "x", [0.1] * 4, t0=10.0)
    assert [(t.at, t.to_level) for t in got] == [(12.0, 1), (14.0, 0)]
