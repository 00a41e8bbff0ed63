"""Edges of the audio timeline: defaults and dtypes, counters that add up, a full buffer, a resumed clock
(stream/ingest.py ``AudioTimeline``).

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed.
"""

from __future__ import annotations

import numpy as np
import pytest

from lingua_fusion.stream.ingest import AudioTimeline
from lingua_fusion.types import SR


def test_timeline_defaults_and_types() -> None:
    t = AudioTimeline()
    assert t.reorder_window == 2.0 and t.max_buffer == 60 * SR
    assert len(t.buf) == 0 and t.buf.dtype == np.float32
    assert t.view(0.0).dtype == np.float32 and t.view(0.0).size == 0
    t.write(np.ones(1600, dtype=np.float32), 0.0)
    assert t.buf.dtype == np.float32 and t.view(0.0).dtype == np.float32


def test_a_chunk_that_ends_exactly_where_consumed_audio_ends_is_late() -> None:
    t = AudioTimeline()
    t.write(np.ones(16000, dtype=np.float32), 0.0)
    t.consume(8000)
    assert t.write(np.ones(8000, dtype=np.float32), 0.0) is False
    assert t.write(np.ones(4000, dtype=np.float32), 0.1) is False
    assert t.stats.late_dropped == 2


def test_reorders_and_gaps_add_up() -> None:
    t = AudioTimeline()
    t.write(np.ones(1600, dtype=np.float32), 0.0)
    t.write(np.ones(1600, dtype=np.float32), 0.5)  # 0.4 s gap
    t.write(np.ones(1600, dtype=np.float32), 1.0)  # 0.4 s gap
    t.write(np.ones(800, dtype=np.float32), 0.2)  # into the first gap
    t.write(np.ones(800, dtype=np.float32), 0.7)  # into the second
    assert t.stats.gap_seconds == pytest.approx(0.8) and t.stats.reordered == 2


def test_a_full_buffer_releases_only_the_oldest_audio() -> None:
    t = AudioTimeline(max_buffer_s=1.0)
    t.write(np.full(int(0.8 * SR), 0.5, dtype=np.float32), 0.0)
    t.write(np.full(int(0.5 * SR), 0.25, dtype=np.float32), 0.8)
    assert t.start == int(0.3 * SR) and len(t.buf) == SR
    assert np.all(t.view(0.3, 0.8) == 0.5) and t.view(0.3, 0.8).size == int(0.5 * SR)


def test_a_resumed_timeline_places_the_first_timestamp_after_what_was_committed() -> None:
    t = AudioTimeline()
    t.start = t.end = 2 * SR  # resumed: 2 s committed, the client's clock origin unknown
    assert t.write(np.ones(1600, dtype=np.float32), 10.0)
    assert t.origin == pytest.approx(8.0) and t.stats.gap_seconds == 0.0 and t.end == 2 * SR + 1600
