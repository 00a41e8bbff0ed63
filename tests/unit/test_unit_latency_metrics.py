"""AL / LAAL / EndOffset against hand-computed examples."""

from __future__ import annotations

import pytest

from lingua_fusion.lab.eval.latency import (
    average_lagging,
    delays_from_finals,
    end_offset,
    length_adaptive_average_lagging,
    summarize,
)


def test_al_hand_computed() -> None:
    # |X| = 4000 ms, 4 words emitted after 1000, 2000, 3000, 4000 ms of source: an ideal wait-1s policy.
    # gamma = 4/4000; terms: 1000-0, 2000-1000, 3000-2000, 4000-3000 -> tau = 4, AL = 1000
    assert average_lagging([1000, 2000, 3000, 4000], 4000) == pytest.approx(1000)


def test_al_stops_at_the_first_word_after_the_whole_source() -> None:
    # words after the source ended do not count beyond tau; |Y| = 3, gamma = 3/3000
    # d = [2000, 3000, 3500]: i=0: 2000; i=1: 3000 >= 3000 -> 3000 - 1000 = 2000, tau = 2 -> AL = 2000
    assert average_lagging([2000, 3000, 3500], 3000) == pytest.approx(2000)


def test_laal_uses_the_longer_of_hypothesis_and_reference() -> None:
    d = [1000, 2000, 3000, 4000]
    # reference of 8 words: gamma = 8/4000 -> (1000-0)+(2000-500)+(3000-1000)+(4000-1500) = 7000 / 4 = 1750
    assert length_adaptive_average_lagging(d, 4000, 8) == pytest.approx(1750)
    # a shorter reference changes nothing: max(|Y|, |Y*|) = |Y|
    assert length_adaptive_average_lagging(d, 4000, 2) == pytest.approx(average_lagging(d, 4000))


def test_first_word_after_source_end_and_end_offset() -> None:
    assert average_lagging([5000, 5200], 4000) == 5000
    assert end_offset([1000, 4500], 4000) == 500
    assert end_offset([], 4000) != end_offset([], 4000)  # NaN when nothing was emitted


def test_delays_from_finals_and_summary() -> None:
    finals = [{"text": "hola a todos", "end": 2.0, "latency_s": 0.5},
              {"text": "adiós", "end": 4.0, "latency_ms": {"caption": 300.0}}]
    assert delays_from_finals(finals) == [2500, 2500, 2500, 4300]
    assert delays_from_finals(finals, computation_aware=False) == [2000, 2000, 2000, 4000]
    s = summarize(finals, 4.0, reference="hola a todos adiós")
    assert s["EndOffset"] == 0.0 and s["EndOffset_ca"] == 300.0
    assert s["AL"] == pytest.approx((2000 + 1000 + 0 + 1000) / 4)
