"""The service's decoded-picture slots (stream/contracts.py Slots): bounded for all streams together, and one key
holds at most half of them, so another key's picture is decoded beside a flood (issue 29: fair per key)."""

from __future__ import annotations

from lingua_fusion.stream.contracts import Slots


def test_one_key_takes_half_the_slots_and_another_key_the_rest() -> None:
    slots = Slots(8)
    assert [slots.take("a") for _ in range(5)] == [True] * 4 + [False]  # exactly half, then refused
    assert [slots.take("b") for _ in range(5)] == [True] * 4 + [False]
    assert not slots.take("c")  # the bound for all keys together holds
    slots.give("a")
    assert slots.take("c") and not slots.take("a")


def test_an_odd_bound_rounds_a_keys_share_up_and_a_bound_of_one_still_serves() -> None:
    slots = Slots(5)
    assert [slots.take("a") for _ in range(4)] == [True, True, True, False]
    one = Slots(1)
    assert one.take("a") and not one.take("b")
    one.give("a")
    assert one.take("b")


def test_giving_back_more_than_was_taken_never_goes_below_zero() -> None:
    slots = Slots(2)
    slots.give("a")
    assert slots.used == 0 and slots.held == {}
    assert slots.take("a")
