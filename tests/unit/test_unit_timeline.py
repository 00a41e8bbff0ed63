"""Pure unit tests of the per-stream audio timeline (16 kHz samples placed by media timestamp)."""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.stream.ingest import SR, AudioTimeline


def tone(seconds: float, value: float) -> np.ndarray:
    return np.full(int(round(seconds * SR)), value, dtype=np.float32)


def test_sample_rate() -> None:
    assert SR == 16000


def test_empty_timeline() -> None:
    tl = AudioTimeline()
    assert tl.end == 0 and tl.end_s == 0.0
    assert tl.view(0.0).size == 0
    assert tl.origin is None


def test_time_zero_is_first_sample_whatever_the_media_timestamp() -> None:
    tl = AudioTimeline()
    assert tl.write(tone(0.5, 0.1), ts=100.0)
    assert tl.origin == 100.0
    assert tl.end == SR // 2
    assert tl.end_s == pytest.approx(0.5)
    assert tl.write(tone(0.5, 0.2), ts=100.5)
    assert tl.end_s == pytest.approx(1.0)
    v = tl.view(0.0, 1.0)
    assert v.shape == (SR,)
    np.testing.assert_allclose(v[: SR // 2], 0.1)
    np.testing.assert_allclose(v[SR // 2:], 0.2)
    assert tl.stats.gap_seconds == 0.0
    assert tl.stats.reordered == 0
    assert tl.stats.chunks == 2


def test_gap_becomes_silence_not_a_shift() -> None:
    tl = AudioTimeline()
    assert tl.write(tone(1.0, 0.5), ts=100.0)
    assert tl.write(tone(1.0, 0.7), ts=101.5)  # 0.5 s missing
    assert tl.stats.gap_seconds == pytest.approx(0.5)
    assert tl.end_s == pytest.approx(2.5)
    np.testing.assert_allclose(tl.view(0.0, 1.0), 0.5)
    gap = tl.view(1.0, 1.5)
    assert gap.shape == (SR // 2,)
    assert not gap.any()
    later = tl.view(1.5, 2.5)
    assert later.shape == (SR,)
    np.testing.assert_allclose(later, 0.7)  # the chunk sits where its timestamp says


def test_late_chunk_within_window_lands_in_its_place() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    assert tl.write(tone(1.0, 0.1), ts=10.0)
    assert tl.write(tone(1.0, 0.3), ts=12.0)  # the 11..12 chunk is late
    assert tl.stats.gap_seconds == pytest.approx(1.0)
    assert tl.write(tone(1.0, 0.2), ts=11.0)
    assert tl.stats.reordered == 1
    assert tl.stats.late_dropped == 0
    assert tl.end_s == pytest.approx(3.0)
    v = tl.view(0.0)
    assert v.shape == (3 * SR,)
    np.testing.assert_allclose(v[:SR], 0.1)
    np.testing.assert_allclose(v[SR: 2 * SR], 0.2)
    np.testing.assert_allclose(v[2 * SR:], 0.3)


def test_chunk_older_than_reorder_window_is_dropped() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    assert tl.write(tone(5.0, 0.1), ts=0.0)
    assert not tl.write(tone(0.5, 0.9), ts=1.0)  # 4 s behind the newest sample
    assert tl.stats.late_dropped == 1
    assert tl.stats.reordered == 0
    np.testing.assert_allclose(tl.view(0.0), 0.1)  # nothing overwritten
    assert tl.end_s == pytest.approx(5.0)
    assert tl.write(tone(0.5, 0.9), ts=3.5)  # 1.5 s behind: inside the window
    assert tl.stats.reordered == 1
    np.testing.assert_allclose(tl.view(3.5, 4.0), 0.9)


def test_chunks_without_timestamp_append() -> None:
    tl = AudioTimeline()
    assert tl.write(tone(0.25, 0.1))
    assert tl.write(tone(0.25, 0.2))
    assert tl.write(tone(0.5, 0.3))
    assert tl.origin == 0.0
    assert tl.end_s == pytest.approx(1.0)
    v = tl.view(0.0)
    np.testing.assert_allclose(v[: SR // 4], 0.1)
    np.testing.assert_allclose(v[SR // 4: SR // 2], 0.2)
    np.testing.assert_allclose(v[SR // 2:], 0.3)
    assert tl.stats.gap_seconds == 0.0 and tl.stats.reordered == 0


def test_untimed_chunk_after_timed_ones_appends() -> None:
    tl = AudioTimeline()
    tl.write(tone(1.0, 0.1), ts=50.0)
    tl.write(tone(1.0, 0.2), ts=52.0)  # 1 s gap
    assert tl.write(tone(0.5, 0.3))  # no ts: right after the furthest sample
    assert tl.end_s == pytest.approx(3.5)
    np.testing.assert_allclose(tl.view(3.0, 3.5), 0.3)


def test_view_bounds() -> None:
    tl = AudioTimeline()
    tl.write(np.arange(SR, dtype=np.float32))
    np.testing.assert_array_equal(tl.view(0.25, 0.5), np.arange(SR // 4, SR // 2, dtype=np.float32))
    assert tl.view(0.5).shape == (SR // 2,)  # open end: up to the furthest sample
    assert tl.view(0.5, 10.0).shape == (SR // 2,)  # clipped to what exists
    assert tl.view(2.0, 3.0).size == 0
    assert tl.view(0.6, 0.4).size == 0


def test_consume_releases_memory_and_hides_the_past() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    tl.write(tone(4.0, 0.1), ts=0.0)
    assert len(tl.buf) == 4 * SR
    tl.consume_s(3.0)
    assert tl.start == 3 * SR
    assert len(tl.buf) == SR
    assert tl.end_s == pytest.approx(4.0)  # the stream clock is unchanged
    assert tl.view(0.0, 3.0).size == 0  # the consumed range is gone
    assert tl.view(0.0).shape == (SR,)  # only what is left
    np.testing.assert_allclose(tl.view(3.0, 4.0), 0.1)


def test_write_entirely_before_consumed_point_is_dropped() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    tl.write(tone(4.0, 0.1), ts=0.0)
    tl.consume_s(3.0)
    # within the reorder window (1.5 s behind the end) but wholly before the consumed point
    assert not tl.write(tone(0.4, 0.9), ts=2.5)
    assert tl.stats.late_dropped == 1
    np.testing.assert_allclose(tl.view(3.0, 4.0), 0.1)


def test_write_straddling_consumed_point_keeps_the_part_after_it() -> None:
    tl = AudioTimeline(reorder_window_s=2.0)
    tl.write(tone(4.0, 0.1), ts=0.0)
    tl.consume_s(3.0)
    assert tl.write(tone(1.0, 0.9), ts=2.5)  # 2.5..3.5: only 3.0..3.5 is kept
    assert len(tl.buf) == SR
    np.testing.assert_allclose(tl.view(3.0, 3.5), 0.9)
    np.testing.assert_allclose(tl.view(3.5, 4.0), 0.1)


def test_consume_is_clamped() -> None:
    tl = AudioTimeline()
    tl.write(tone(1.0, 0.1))
    tl.consume_s(0.5)
    tl.consume_s(0.25)  # backwards: no effect
    assert tl.start == SR // 2
    tl.consume_s(5.0)  # beyond the end: up to the end
    assert tl.start == SR and len(tl.buf) == 0
    assert tl.write(tone(0.5, 0.2))
    assert tl.end_s == pytest.approx(1.5)
    np.testing.assert_allclose(tl.view(1.0, 1.5), 0.2)


def test_max_buffer_bounds_memory_under_a_long_stream() -> None:
    tl = AudioTimeline(max_buffer_s=5.0)
    for i in range(60):  # a minute of audio, never consumed
        assert tl.write(tone(1.0, float(i)), ts=1000.0 + i)
        assert len(tl.buf) <= 5 * SR
    assert tl.end_s == pytest.approx(60.0)
    assert tl.start == 55 * SR
    assert len(tl.buf) == 5 * SR
    np.testing.assert_allclose(tl.view(59.0, 60.0), 59.0)  # the newest audio is intact
    np.testing.assert_allclose(tl.view(55.0, 56.0), 55.0)
    assert tl.view(0.0, 55.0).size == 0


def test_max_buffer_bounds_memory_across_a_long_gap() -> None:
    tl = AudioTimeline(max_buffer_s=2.0)
    tl.write(tone(1.0, 0.1), ts=0.0)
    assert tl.write(tone(1.0, 0.2), ts=3600.0)  # the client paused for an hour
    assert tl.stats.gap_seconds == pytest.approx(3599.0)
    assert len(tl.buf) <= 2 * SR
    assert tl.end_s == pytest.approx(3601.0)
    np.testing.assert_allclose(tl.view(3600.0, 3601.0), 0.2)
    assert tl.write(tone(0.5, 0.3))  # appending still works
    assert len(tl.buf) <= 2 * SR
    np.testing.assert_allclose(tl.view(3601.0, 3601.5), 0.3)


def test_an_empty_chunk_neither_sets_the_clock_nor_counts_as_dropped() -> None:
    """A first, empty chunk at ts=100 set the stream's time zero, so every later chunk (ts 0, 0.5, ...) was
    dropped as late, silently: no caption and no notice (found by an attack)."""
    tl = AudioTimeline()
    assert tl.write(np.zeros(0, dtype=np.float32), ts=100.0)
    for i in range(4):
        assert tl.write(np.full(SR // 2, 0.1, dtype=np.float32), ts=i * 0.5)
    assert tl.stats.late_dropped == 0 and tl.end == 2 * SR and tl.origin == 0.0
