"""Edges of the cross-stream scheduler (serving/scheduler.py): the cost model's fit and defaults, exact batch and
shedding boundaries, lanes, per-key bookkeeping, the queue bounds, scores, admission at exactly its limit.

Found unguarded by mutation testing (``make mutation``, scripts/mutation.py): each test pins a behaviour a
mutant changed while every other test still passed. Numbers are chosen exact in binary (0.25, 0.5, 1.0) where a
boundary is tested with equality.
"""

from __future__ import annotations

import pytest

from lingua_fusion.serving.scheduler import CostModel, Demand, Scheduler, WorkItem


def item(name: str = "s", *, deadline: float, enqueued: float = 0.0, importance: float = 0.5,
         tentative: bool = False, model: str = "asr", key: str = "", units: float = 1.0) -> WorkItem:
    return WorkItem(stream_id=name, model=model, stage="asr", enqueued=enqueued, deadline=deadline,
                    importance=importance, tentative=tentative, payload=name, key_id=key, units=units)


def names(batch: list[WorkItem]) -> list[str]:
    return [w.payload for w in batch]


# ---- the cost model -------------------------------------------------------------------------------------------
def test_cost_model_defaults() -> None:
    c = CostModel()
    assert (c.c0, c.c1, c.decay) == (0.2, 0.1, 0.95)
    s = Scheduler()
    assert (s.alpha, s.max_batch, s.max_queue, s.target_utilisation) == (0.65, 8, 256, 0.8)
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\]$"):
        Scheduler(alpha=1.5)


def test_two_batch_sizes_are_fitted_exactly() -> None:
    c = CostModel()
    c.observe(1, 0.3)
    c.observe(2, 0.5)  # a weighted variance under 1: still a fit, not the one-size fallback
    assert (c.c0, c.c1) == (pytest.approx(0.1), pytest.approx(0.2))
    flat = CostModel()
    flat.observe(1, 0.3)
    flat.observe(2, 0.3)  # a slope of exactly 0 is a fit too
    assert (flat.c0, flat.c1) == (pytest.approx(0.3), 0.0)


def test_the_largest_batch_within_a_budget_that_fits_exactly() -> None:
    assert CostModel(c0=0.1, c1=0.1).max_batch_within(0.5, 8) == 4  # (0.5 - 0.1) / 0.1 is 4 up to rounding


# ---- lanes and bookkeeping -------------------------------------------------------------------------------------
def test_budgets_equal_to_the_millisecond_share_a_lane() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.01, c1=0.01)})
    s.submit(item("first", deadline=0.4004))  # budget 0.4004: the lane of 0.4 s
    s.submit(item("second", deadline=0.4))
    assert names(s.next_batch("asr", now=0.0)[0]) == ["first"]  # one lane: first in, first considered
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.01, c1=0.01)})
    s.submit(item("loose", deadline=0.4))
    s.submit(item("tight", deadline=0.2))  # its own lane: considered, and more urgent
    assert names(s.next_batch("asr", now=0.0)[0]) == ["tight"]


def test_per_key_counts_follow_every_way_in_and_out() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.25, c1=0.25)})
    for i in range(3):
        s.submit(item(f"a{i}", deadline=10.0 + i, key="A"))
    s.submit(item("b0", deadline=10.0, key="B", tentative=True))
    s.submit(item("b1", deadline=1.25, key="B", tentative=True))
    q = s.queues["asr"]
    assert dict(q.per_key) == {"A": 3, "B": 2}
    s.next_batch("asr", now=1.0)  # ready 1.5: b1 is shed, one item runs
    assert sum(q.per_key.values()) == len(q) == 3
    dropped = s.drop_stream("a2")
    assert names(dropped) == ["a2"] and sum(q.per_key.values()) == len(q) == 2
    while len(q):
        s.next_batch("asr", now=1.0)
    assert dict(q.per_key) == {}


def test_dropping_a_stream_takes_its_items_from_every_lane() -> None:
    s = Scheduler()
    s.submit(item("x", deadline=1.0))
    s.submit(item("x", deadline=5.0))  # another budget: another lane
    s.submit(item("x", deadline=2.0, tentative=True))
    s.submit(item("y", deadline=1.0))
    assert sorted(w.deadline for w in s.drop_stream("x")) == [1.0, 2.0, 5.0]
    assert s.depth("asr") == 1 and dict(s.queues["asr"].per_key) == {"": 1}


def test_an_idle_keys_finish_tag_is_forgotten_once_the_virtual_time_reaches_it() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.01, c1=0.01)})
    for name, key in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        s.submit(item(name, deadline=100.0, key=key))
    order = [names(s.next_batch("asr", now=0.0)[0])[0] for _ in range(3)]
    assert order == ["a1", "b1", "a2"]
    assert s.finish["asr"] == {"A": 2.0, "B": 1.0} and s.vtime["asr"] == 1.0
    s.drop_stream("nobody")
    assert s.finish["asr"] == {"A": 2.0}  # B's tag (1.0) is not above V: it is not credit, forget it


# ---- shedding ---------------------------------------------------------------------------------------------------
def test_shedding_looks_at_every_tentative_lane_and_keeps_what_can_still_just_make_it() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.25, c1=0.25)})
    s.submit(item("committed", deadline=0.5))  # a committed lane first: never shed, and not the end of the search
    s.submit(item("exact", deadline=1.5, tentative=True))  # ready = 1.0 + 0.5: exactly in time
    s.submit(item("late", deadline=1.25, enqueued=0.5, tentative=True))  # another lane: past rescue
    batch, shed = s.next_batch("asr", now=1.0)
    assert names(shed) == ["late"] and "exact" in names(batch) + names(list(s.queues["asr"]))
    assert s.stats.shed == 1
    s.submit(item("late2", deadline=1.25, enqueued=0.5, tentative=True))
    s.next_batch("asr", now=1.0)
    assert s.stats.shed == 2  # counted over calls


def test_ready_is_now_plus_one_items_predicted_time() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.25, c1=0.25)})
    s.submit(item("t", deadline=1.625, tentative=True))  # in time for one item (1.5), not for two (1.75)
    batch, shed = s.next_batch("asr", now=1.0)
    assert names(batch) == ["t"] and shed == []


# ---- batch size at its exact limits ------------------------------------------------------------------------------
def test_the_batch_that_exactly_meets_the_tightest_deadline_is_taken() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.0, c1=1.0)})
    for i in range(4):
        s.submit(item(f"i{i}", deadline=3.0 if i == 0 else 50.0))
    batch, _ = s.next_batch("asr", now=0.0)
    assert len(batch) == 3  # 3 items take exactly 3.0 s; 4 would miss the deadline


def test_an_item_due_exactly_when_one_item_would_be_ready_still_constrains_the_batch() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.25, c1=0.25)})
    s.submit(item("due", deadline=1.5))  # ready = 1.0 + 0.5 = 1.5: still rescuable
    s.submit(item("b", deadline=10.0))
    s.submit(item("c", deadline=10.0))
    batch, _ = s.next_batch("asr", now=1.0)
    assert names(batch) == ["due"]


def test_a_less_urgent_but_more_important_item_first_does_not_loosen_the_bound() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.0, c1=1.0)})
    s.submit(item("vip", deadline=10.0, importance=1.0))
    s.submit(item("urgent", deadline=1.5, importance=0.0))
    batch, _ = s.next_batch("asr", now=0.0)
    assert names(batch) == ["vip"]  # two items take 2 s: the urgent one's 1.5 s counts though it ranks second


def test_batch_caps_by_model_family_and_one_for_the_per_stream_baseline() -> None:
    s = Scheduler(max_batch=8)
    s.batch_scale = {"mt": 4}
    assert s.batch_cap("mt:en-es") == 32 and s.batch_cap("asr:tiny.en") == 8
    one = Scheduler(max_batch=1)
    one.batch_scale = {"mt": 4}
    assert one.batch_cap("mt:en-es") == 1
    two = Scheduler(max_batch=2)
    two.batch_scale = {"mt": 4}
    assert two.batch_cap("mt:en-es") == 8


def test_units_bound_a_batch_from_the_first_item_on() -> None:
    s = Scheduler(costs={"mt:en-es": CostModel(c0=0.01, c1=0.0)})
    s.max_units = {"mt": 10.0}
    for i in range(3):
        s.submit(item(f"m{i}", deadline=100.0, model="mt:en-es", units=5.0))
    assert len(s.next_batch("mt:en-es", now=0.0)[0]) == 2  # 5 + 5 = 10: fits exactly


# ---- scores -------------------------------------------------------------------------------------------------------
def test_score_is_importance_and_risk_weighted_by_alpha() -> None:
    s = Scheduler(alpha=0.5, costs={"asr": CostModel(c0=1.0, c1=0.0)})
    w = item(deadline=3.0, enqueued=1.0, importance=0.5)  # budget 2 s
    assert s.score(w, now=1.0) == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)  # ready 2.0: half the budget used
    assert s.score(w, now=3.0) == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)  # risk 1.5 is clamped to 1
    assert s.score(w, now=-5.0) == pytest.approx(0.5 * 0.5)  # risk below 0 is clamped to 0
    assert s.score(item(deadline=1.0, enqueued=1.0), now=0.0) == pytest.approx(0.25 + 0.5)  # no budget: risk 1


def test_a_budget_of_exactly_one_millisecond_counts_as_none() -> None:
    s = Scheduler(alpha=0.5, costs={"asr": CostModel(c0=0.0, c1=0.0)})
    w = item(deadline=0.001, enqueued=0.0, importance=0.0)
    assert s.score(w, now=0.0005) == pytest.approx(0.5)  # risk 1, not 0.5


# ---- queue bounds -------------------------------------------------------------------------------------------------
def test_a_full_queue_refuses_committed_work_at_exactly_its_bound() -> None:
    s = Scheduler(max_queue=2)
    assert s.submit(item("a", deadline=1.0)) and s.submit(item("b", deadline=1.0))
    assert not s.submit(item("c", deadline=1.0)) and s.depth("asr") == 2 and s.stats.rejected_full == 1


def test_a_full_queue_makes_room_from_any_keys_tentative_work() -> None:
    s = Scheduler(max_queue=2)
    s.submit(item("a1", deadline=1.0, key="A", tentative=True))
    s.submit(item("a2", deadline=2.0, key="A", tentative=True))
    assert s.submit(item("b", deadline=1.0, key="B"))  # B has no tentative work of its own: A's goes
    assert sorted(names(list(s.queues["asr"]))) == ["a1", "b"] and s.stats.shed == 1


def test_one_key_holds_at_most_its_share_starting_from_its_first_item() -> None:
    s = Scheduler(max_queue=10)
    s.max_queue_per_key = 1
    assert s.submit(item("a1", deadline=1.0, key="A"))  # its first item: within the share
    assert not s.submit(item("a2", deadline=1.0, key="A"))  # at its share, with room in the queue
    assert s.submit(item("b1", deadline=1.0, key="B"))
    s.max_queue_per_key = 2
    assert s.submit(item("a2", deadline=1.0, key="A")) and not s.submit(item("a3", deadline=1.0, key="A"))


# ---- admission and capacity -----------------------------------------------------------------------------------
def test_admission_at_exactly_the_target_utilisation_admits() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.0, c1=0.5)})
    assert s.capacity("asr", "standard") == 2.0  # one item per 0.5 s
    assert s.admit(Demand("a", "standard", {"asr": 1.6}))  # 0.8 x 2.0: exactly at the target
    assert not s.admit(Demand("b", "standard", {"asr": 0.001}))


def test_capacity_uses_the_stage_share_of_the_model_family() -> None:
    s = Scheduler(costs={"asr:tiny.en": CostModel(c0=0.1, c1=0.1), "foo:x": CostModel(c0=0.1, c1=0.1)})
    assert s.capacity("asr:tiny.en", "standard") == pytest.approx(8 / 0.9)  # 3 s x 0.6 / 2 = 0.9 s: 8 items
    assert s.capacity("foo:x", "standard") == pytest.approx(6 / 0.7)  # unknown stage: half the budget


def test_a_fit_through_the_origin_is_a_fit() -> None:
    c = CostModel()
    c.observe(1, 0.25)
    c.observe(2, 0.5)  # latency proportional to batch size: c0 is exactly 0
    assert (c.c0, c.c1) == (0.0, 0.25)


def test_round_robin_fills_its_units_exactly() -> None:
    from lingua_fusion.serving.fair import round_robin

    items = [("A", 5.0, "a1"), ("B", 5.0, "b1"), ("A", 5.0, "a2")]
    taken, left = round_robin(items, key=lambda it: it[0], units=lambda it: it[1], max_items=10, max_units=10.0)
    assert [it[2] for it in taken] == ["a1", "b1"] and [it[2] for it in left] == ["a2"]  # 5 + 5 = 10 fits
