"""The SLO circuit breaker with a fake clock."""

from __future__ import annotations

from lingua_fusion.stream.breaker import STEPS, SLOBreaker


def feed(b: SLOBreaker, slo: str, latency: float, t0: float, windows: int, per_window: int = 4) -> list:
    out = []
    for w in range(windows):
        for i in range(per_window):
            out += b.record(slo, latency, t0 + w * b.window_s + i * b.window_s / per_window)
    return out


def test_trips_after_k_breached_windows_and_not_before() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=5.0, k=3)
    assert feed(b, "standard", 4.0, 0.0, 3) == []  # the 3rd window only closes when time passes its end
    trans = b.tick(15.0)
    assert [(t.from_level, t.to_level, t.step) for t in trans] == [(0, 1, "drop_partials")]
    assert b.active("standard", "drop_partials") and not b.active("standard", "skip_vision")
    assert trans[0].at == 15.0 and trans[0].p99 == 4.0


def test_one_step_at_a_time_down_the_ladder() -> None:
    b = SLOBreaker({"interactive": 1.0}, window_s=1.0, k=2)
    trans = feed(b, "interactive", 2.0, 0.0, 11) + b.tick(11.0)
    assert [t.to_level for t in trans] == [1, 2, 3, 4, 5]  # every 2 breached windows, capped at the last step
    assert [t.step for t in trans] == list(STEPS)
    assert b.level("interactive") == len(STEPS)


def test_restores_with_hysteresis() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=5.0, k=3, restore_ratio=0.8)
    feed(b, "standard", 4.0, 0.0, 3)
    b.tick(15.0)
    assert b.level("standard") == 1
    # just under the target but above 0.8 x target: holds, does not restore
    assert feed(b, "standard", 2.9, 15.0, 5) + b.tick(40.0) == []
    assert b.level("standard") == 1
    trans = feed(b, "standard", 1.0, 40.0, 3) + b.tick(55.0)
    assert [(t.from_level, t.to_level) for t in trans] == [(1, 0)]


def test_idle_windows_neither_trip_nor_restore_and_classes_are_separate() -> None:
    b = SLOBreaker({"standard": 3.0, "batch": 30.0}, window_s=5.0, k=2)
    feed(b, "standard", 4.0, 0.0, 1)
    b.tick(100.0)  # many empty windows later
    assert b.level("standard") == 0
    feed(b, "standard", 4.0, 100.0, 2)
    feed(b, "batch", 4.0, 100.0, 2)
    trans = b.tick(110.0)
    assert [t.slo for t in trans] == ["standard"] and b.level("batch") == 0


def test_a_breached_run_is_broken_by_a_healthy_window() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=5.0, k=3)
    feed(b, "standard", 4.0, 0.0, 2)
    feed(b, "standard", 1.0, 10.0, 1)
    feed(b, "standard", 4.0, 15.0, 2)
    assert b.tick(25.0) == [] and b.level("standard") == 0


def test_a_stage_over_its_share_trips_the_class_and_restore_waits_for_it() -> None:
    b = SLOBreaker({"standard": 3.0}, window_s=1.0, k=2, stage_share={"mt": 0.3})
    trans = []
    for w in range(3):  # captions within 3 s, but MT takes 1.2 s: over its 0.9 s share
        trans += b.record("standard", 2.0, w + 0.1) + b.record("standard", 1.2, w + 0.2, stage="mt")
    trans += b.tick(3.0)
    assert [(t.to_level, t.stage, t.p99) for t in trans] == [(1, "mt", 1.2)]
    # captions are healthy again but MT still breaches: no restore while a stage is over its target
    for w in range(3, 6):
        trans += b.record("standard", 1.0, w + 0.1) + b.record("standard", 1.2, w + 0.2, stage="mt")
    assert b.level("standard") >= 1 and all(t.to_level >= t.from_level for t in trans)
    b2 = SLOBreaker({"standard": 3.0}, window_s=1.0, k=2, stage_share={"mt": 0.3})
    for w in range(4):  # MT within its share: the caption windows alone decide, nothing trips
        b2.record("standard", 1.0, w + 0.1)
        b2.record("standard", 0.5, w + 0.2, stage="mt")
    assert b2.tick(10.0) == [] and b2.level("standard") == 0


def test_a_degraded_class_that_goes_quiet_is_restored() -> None:
    """Idle windows alone neither trip nor restore, but a degraded class with no window of traffic for ``quiet_s``
    (its streams ended, were shed or refused) is restored to level 0 in one move: otherwise it would stay degraded
    for good with nothing left to measure, refusing its new streams."""
    b = SLOBreaker({"standard": 3.0, "batch": 30.0}, window_s=1.0, k=1, quiet_s=10.0)
    b.record("standard", 10.0, 0.0)
    b.record("batch", 1.0, 0.0)
    assert [t.to_level for t in b.tick(1.0)] == [1] and b.level("standard") == 1
    assert b.tick(11.0) == [] and b.level("standard") == 1  # the last window with traffic ended 10 s ago
    (t,) = b.tick(11.5)
    assert (t.slo, t.from_level, t.to_level, t.p99) == ("standard", 1, 0, None) and b.level("standard") == 0
    b.record("standard", 10.0, 11.6)
    b.tick(12.6)  # traffic again, still breaching: down again, from 0
    assert b.level("standard") == 1 and b.level("batch") == 0
    assert SLOBreaker({"x": 1.0}, window_s=5.0).quiet_s == 60.0  # the default, and never under two windows
    assert SLOBreaker({"x": 1.0}, window_s=50.0).quiet_s == 100.0


def test_an_operators_restore_returns_every_class_to_level_0_and_counts_afresh() -> None:
    b = SLOBreaker({"standard": 3.0, "batch": 10.0}, window_s=5.0, k=3)
    feed(b, "standard", 4.0, 0.0, 3)
    b.tick(15.0)
    feed(b, "standard", 4.0, 15.0, 2)  # breached windows on the way to the next step
    trans = b.restore(26.0)
    assert [(t.slo, t.from_level, t.to_level) for t in trans] == [("standard", 1, 0)]
    assert b.level("standard") == 0 and b.restore(26.0) == []  # nothing left to restore
    # the runs before the reset do not count: it takes K breached windows again to trip
    feed(b, "standard", 4.0, 26.0, 2)
    assert b.tick(36.0) == [] and b.level("standard") == 0
    assert [t.to_level for t in feed(b, "standard", 4.0, 36.0, 1) + b.tick(41.0)] == [1]
