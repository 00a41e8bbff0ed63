"""Pure unit tests of the cross-stream scheduler (fake clock: ``now`` is passed explicitly)."""

from __future__ import annotations

import pytest

from lingua_fusion.serving.ports import SLO_CLASSES, stage_deadline
from lingua_fusion.serving.scheduler import CostModel, Demand, Scheduler, WorkItem


def item(stream: str = "s1", *, deadline: float, enqueued: float = 0.0, importance: float = 0.5,
         tentative: bool = False, model: str = "asr", payload: object = None) -> WorkItem:
    return WorkItem(stream_id=stream, model=model, stage="asr", enqueued=enqueued, deadline=deadline,
                    importance=importance, tentative=tentative, payload=payload)


# ---- deadlines and SLO classes -------------------------------------------------------------------------------
def test_stage_deadline_uses_slo_and_stage_budget() -> None:
    assert SLO_CLASSES == {"interactive": 1.0, "standard": 3.0, "batch": 30.0}
    assert stage_deadline("interactive", "asr", 10.0) == pytest.approx(10.6)
    assert stage_deadline("standard", "mt", 10.0) == pytest.approx(10.9)
    assert stage_deadline("batch", "tts", 0.0) == pytest.approx(15.0)
    assert stage_deadline("interactive", "unknown-stage", 2.0) == pytest.approx(2.5)  # default share 0.5
    with pytest.raises(KeyError):
        stage_deadline("platinum", "asr", 0.0)


def test_work_items_get_increasing_sequence_numbers() -> None:
    a, b = item(deadline=1.0), item(deadline=1.0)
    assert b.seq > a.seq


# ---- (a) deadline order --------------------------------------------------------------------------------------
def test_equal_importance_nearer_deadline_first() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    late = item("late", deadline=5.0, payload="late")
    near = item("near", deadline=2.0, payload="near")
    mid = item("mid", deadline=3.0, payload="mid")
    for w in (late, near, mid):
        assert s.submit(w)
    order = []
    for _ in range(3):
        batch, shed = s.next_batch("asr", now=0.0)
        assert shed == []
        assert len(batch) == 1
        order.append(batch[0].payload)
    assert order == ["near", "mid", "late"]
    assert s.next_batch("asr", now=0.0) == ([], [])
    assert s.stats.batches == 3
    assert s.stats.batch_sizes[1] == 3


def test_batch_is_ordered_by_deadline_when_importance_is_equal() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for d in (9.0, 7.0, 8.0):
        s.submit(item(deadline=d))
    batch, _ = s.next_batch("asr", now=0.0)
    assert [w.deadline for w in batch] == [7.0, 8.0, 9.0]


# ---- (b) priority --------------------------------------------------------------------------------------------
def test_score_formula() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.2, c1=0.1)})  # predict(1) = 0.3
    w = item(deadline=2.0, enqueued=0.0, importance=0.9)
    # slack = 2.0 - 0 - 0.3 = 1.7, budget 2.0, risk = 1 - 0.85 = 0.15
    assert s.score(w, now=0.0) == pytest.approx(0.65 * 0.9 + 0.35 * 0.15)
    # past the deadline risk saturates at 1
    assert s.score(w, now=10.0) == pytest.approx(0.65 * 0.9 + 0.35 * 1.0)
    # far from the deadline risk floors at 0
    far = item(deadline=100.0, enqueued=99.0, importance=0.2)
    assert s.score(far, now=0.0) == pytest.approx(0.65 * 0.2)


def test_importance_beats_deadline_when_risk_is_similar() -> None:
    s = Scheduler(max_batch=1, costs={"asr": CostModel(c0=0.2, c1=0.1)})
    important = item("a", deadline=2.0, importance=0.9, payload="important")
    urgent = item("b", deadline=1.0, importance=0.1, payload="urgent")
    s.submit(urgent)
    s.submit(important)
    assert s.score(important, 0.0) > s.score(urgent, 0.0)
    first, _ = s.next_batch("asr", now=0.0)
    second, _ = s.next_batch("asr", now=0.0)
    assert [first[0].payload, second[0].payload] == ["important", "urgent"]


def test_alpha_zero_is_pure_deadline_risk() -> None:
    s = Scheduler(alpha=0.0, max_batch=1, costs={"asr": CostModel(c0=0.2, c1=0.1)})
    important = item("a", deadline=2.0, importance=0.9, payload="important")
    urgent = item("b", deadline=1.0, importance=0.1, payload="urgent")
    s.submit(important)
    s.submit(urgent)
    # risk only: urgent 1 - 0.7/1.0 = 0.3, important 1 - 1.7/2.0 = 0.15
    assert s.score(urgent, 0.0) == pytest.approx(0.3)
    assert s.score(important, 0.0) == pytest.approx(0.15)
    first, _ = s.next_batch("asr", now=0.0)
    assert first[0].payload == "urgent"


def test_alpha_one_is_pure_importance() -> None:
    s = Scheduler(alpha=1.0, costs={"asr": CostModel(c0=0.2, c1=0.1)})
    assert s.score(item(deadline=0.5, importance=0.4), 0.0) == pytest.approx(0.4)


@pytest.mark.parametrize("alpha", [-0.01, 1.01, 2.0, -1.0])
def test_alpha_outside_unit_interval_raises(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        Scheduler(alpha=alpha)


# ---- (c) batch sizing ----------------------------------------------------------------------------------------
def test_batch_is_largest_that_meets_tightest_deadline() -> None:
    s = Scheduler(max_batch=8, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for _ in range(10):
        s.submit(item(deadline=0.55))
    # 0.1 + 0.1*4 = 0.5 <= 0.55 < 0.6 = 0.1 + 0.1*5
    batch, shed = s.next_batch("asr", now=0.0)
    assert shed == []
    assert len(batch) == 4
    assert s.depth("asr") == 6
    assert s.stats.batch_sizes[4] == 1


def test_batch_size_follows_now() -> None:
    s = Scheduler(max_batch=8, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for _ in range(10):
        s.submit(item(deadline=10.55))
    batch, _ = s.next_batch("asr", now=10.0)  # 10 + 0.1 + 0.1*4 = 10.5 <= 10.55
    assert len(batch) == 4


def test_batch_never_exceeds_max_batch() -> None:
    s = Scheduler(max_batch=3, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for _ in range(10):
        s.submit(item(deadline=100.0))
    sizes = []
    while s.depth("asr"):
        batch, _ = s.next_batch("asr", now=0.0)
        sizes.append(len(batch))
    assert sizes == [3, 3, 3, 1]


def test_late_committed_work_runs_in_the_largest_batch() -> None:
    s = Scheduler(max_batch=4, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for _ in range(5):
        s.submit(item(deadline=0.15))  # even one item (0.2 s) misses: no deadline can be met any more
    batch, shed = s.next_batch("asr", now=0.0)
    assert len(batch) == 4  # so throughput decides: catch up as fast as possible (never shed: committed)
    assert shed == []
    assert s.depth("asr") == 1


def test_late_items_do_not_shrink_a_batch_for_items_that_can_still_make_it() -> None:
    s = Scheduler(max_batch=8, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    s.submit(item(deadline=0.15, importance=0.9))  # hopeless already, but committed: it runs first
    for _ in range(4):
        s.submit(item(deadline=0.45))  # 1 + 3 fit: 0.1 + 0.1*4 = 0.5 > 0.45, 0.1 + 0.1*3 = 0.4 <= 0.45
    batch, _ = s.next_batch("asr", now=0.0)
    assert len(batch) == 3 and batch[0].deadline == 0.15


def test_items_from_different_streams_batch_together() -> None:
    s = Scheduler(max_batch=8, costs={"asr": CostModel(c0=0.1, c1=0.1)})
    for sid in ("s1", "s2", "s3"):
        s.submit(item(sid, deadline=50.0))
    batch, _ = s.next_batch("asr", now=0.0)
    assert sorted(w.stream_id for w in batch) == ["s1", "s2", "s3"]
    assert s.depth("asr") == 0


def test_models_are_queued_separately() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1), "mt": CostModel(c0=0.1, c1=0.1)})
    s.submit(item(deadline=50.0, model="asr"))
    s.submit(item(deadline=50.0, model="mt"))
    s.submit(item(deadline=50.0, model="mt"))
    batch, _ = s.next_batch("mt", now=0.0)
    assert len(batch) == 2 and all(w.model == "mt" for w in batch)
    assert s.depth("asr") == 1
    assert s.next_batch("ocr", now=0.0) == ([], [])
    assert s.depth("ocr") == 0


# ---- (d) cost model ------------------------------------------------------------------------------------------
def test_cost_model_predict() -> None:
    cm = CostModel(c0=0.2, c1=0.1)
    assert cm.predict(1) == pytest.approx(0.3)
    assert cm.predict(4) == pytest.approx(0.6)
    assert CostModel(c0=0.0, c1=0.0).predict(3) == 0.0


def test_cost_model_learns_intercept_and_slope() -> None:
    cm = CostModel(c0=1.0, c1=1.0)
    for _ in range(5):
        for b in (1, 2, 4, 8, 3, 6):
            cm.observe(b, 0.2 + 0.05 * b)
    assert cm.observations == 30
    assert cm.c0 == pytest.approx(0.2, abs=1e-3)
    assert cm.c1 == pytest.approx(0.05, abs=1e-3)
    assert cm.predict(10) == pytest.approx(0.7, abs=1e-2)


def test_cost_model_tracks_a_change() -> None:
    cm = CostModel()
    for _ in range(3):
        for b in (1, 2, 4, 8):
            cm.observe(b, 0.2 + 0.05 * b)
    for _ in range(40):  # the hardware got slower: the exponential decay forgets the old regime
        for b in (1, 2, 4, 8):
            cm.observe(b, 0.4 + 0.1 * b)
    assert cm.c0 == pytest.approx(0.4, abs=1e-2)
    assert cm.c1 == pytest.approx(0.1, abs=1e-2)


def test_cost_model_single_batch_size_keeps_slope_moves_intercept() -> None:
    cm = CostModel(c0=0.5, c1=0.1)
    for _ in range(3):
        cm.observe(4, 1.0)
    assert cm.c1 == pytest.approx(0.1)
    assert cm.c0 == pytest.approx(0.6)  # 1.0 - 0.1*4
    assert cm.predict(4) == pytest.approx(1.0)


def test_cost_model_negative_fit_is_rejected() -> None:
    cm = CostModel(c0=0.1, c1=0.1)
    cm.observe(1, 1.0)
    cm.observe(8, 0.2)  # latency falling with batch size: slope would be negative
    assert cm.c1 == pytest.approx(0.1)
    assert cm.c0 >= 0.0


def test_max_batch_within() -> None:
    cm = CostModel(c0=0.1, c1=0.1)
    assert cm.max_batch_within(0.55, 8) == 4
    assert cm.max_batch_within(100.0, 8) == 8  # capped
    assert cm.max_batch_within(0.05, 8) == 1  # at least one
    assert CostModel(c0=0.1, c1=0.0).max_batch_within(0.01, 5) == 5  # free per item: the cap


def test_scheduler_observe_feeds_the_models_cost() -> None:
    s = Scheduler()
    for _ in range(3):
        for b in (1, 2, 4):
            s.observe("asr", b, 0.2 + 0.05 * b)
    assert s.cost("asr").c0 == pytest.approx(0.2, abs=1e-3)
    assert s.cost("asr").c1 == pytest.approx(0.05, abs=1e-3)
    assert s.cost("asr") is s.costs["asr"]


# ---- (e) shedding --------------------------------------------------------------------------------------------
def test_tentative_item_that_cannot_meet_deadline_is_shed() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1)})
    doomed = item("s1", deadline=10.1, tentative=True, payload="doomed")
    fine = item("s1", deadline=20.0, tentative=True, payload="fine")
    s.submit(doomed)
    s.submit(fine)
    batch, shed = s.next_batch("asr", now=10.0)  # 10 + 0.2 > 10.1
    assert [w.payload for w in shed] == ["doomed"]
    assert [w.payload for w in batch] == ["fine"]
    assert s.stats.shed == 1
    assert s.depth("asr") == 0
    assert s.next_batch("asr", now=10.0) == ([], [])  # never run later


def test_only_shed_items_returns_empty_batch() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1)})
    s.submit(item(deadline=1.0, tentative=True))
    s.submit(item(deadline=1.0, tentative=True))
    batch, shed = s.next_batch("asr", now=5.0)
    assert batch == []
    assert len(shed) == 2
    assert s.stats.shed == 2
    assert s.stats.batches == 0


def test_committed_item_past_deadline_is_never_shed() -> None:
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1)})
    late = item("s1", deadline=1.0, tentative=False, payload="committed")
    s.submit(late)
    batch, shed = s.next_batch("asr", now=5.0)
    assert shed == []
    assert [w.payload for w in batch] == ["committed"]
    assert s.stats.shed == 0


# ---- (f) bounded queues --------------------------------------------------------------------------------------
def test_full_queue_refuses_committed_work_without_tentative_victim() -> None:
    s = Scheduler(max_queue=2)
    assert s.submit(item(deadline=1.0))
    assert s.submit(item(deadline=1.0))
    assert not s.submit(item(deadline=1.0))
    assert not s.submit(item(deadline=1.0, tentative=True))
    assert s.depth("asr") == 2
    assert s.stats.rejected_full == 2
    assert s.stats.submitted == 2
    assert s.stats.shed == 0


def test_full_queue_evicts_least_important_tentative() -> None:
    s = Scheduler(max_queue=3)
    s.submit(item(deadline=1.0, tentative=False, payload="committed"))
    s.submit(item(deadline=1.0, tentative=True, importance=0.8, payload="keep"))
    s.submit(item(deadline=1.0, tentative=True, importance=0.2, payload="victim"))
    assert s.submit(item(deadline=1.0, tentative=False, payload="new"))
    assert s.stats.shed == 1
    assert s.depth("asr") == 3
    assert sorted(w.payload for w in s.queues["asr"]) == ["committed", "keep", "new"]


def test_the_evicted_item_is_handed_back_so_its_caller_can_be_told() -> None:
    """Whoever waits for an evicted partial must hear it was shed (the executor resolves it to None); before,
    submit dropped it silently and its caller waited until its timeout (300 s), its stream without partials."""
    s = Scheduler(max_queue=2)
    victim = item(deadline=1.0, tentative=True, importance=0.2, payload="victim")
    assert s.submit_or_shed(victim) == (True, None)
    assert s.submit_or_shed(item(deadline=1.0, payload="a")) == (True, None)
    queued, shed = s.submit_or_shed(item(deadline=1.0, payload="b"))
    assert queued and shed is victim
    assert s.submit_or_shed(item(deadline=1.0, payload="c")) == (False, None)  # only committed work is left


def test_shed_alone_drops_expired_partials_and_withdraw_takes_back_a_waiting_item() -> None:
    """A runner with no room (one still starting) gets no batch, but partials past their deadlines still go
    (``shed``); a committed item whose caller gave up is taken out (``withdraw``), so a retry cannot run it twice."""
    s = Scheduler(costs={"asr": CostModel(c0=0.1, c1=0.1)})
    doomed = item(deadline=1.0, tentative=True, payload="doomed")
    committed = item(deadline=1.0, payload="committed")
    twin = item(deadline=1.0, payload="committed")  # equal fields, another item
    for w in (doomed, committed, twin):
        s.submit(w)
    assert s.shed("asr", now=5.0) == [doomed] and s.depth("asr") == 2
    assert s.withdraw(committed) and not s.withdraw(committed)
    batch, _ = s.next_batch("asr", now=5.0)
    assert len(batch) == 1 and batch[0] is twin


def test_eviction_ties_drop_the_latest_deadline() -> None:
    s = Scheduler(max_queue=2)
    s.submit(item(deadline=1.0, tentative=True, importance=0.5, payload="soon"))
    s.submit(item(deadline=9.0, tentative=True, importance=0.5, payload="later"))
    assert s.submit(item(deadline=1.0, payload="new"))
    assert sorted(w.payload for w in s.queues["asr"]) == ["new", "soon"]


def test_depth_never_exceeds_max_queue() -> None:
    s = Scheduler(max_queue=5)
    for i in range(50):
        s.submit(item(deadline=float(i), tentative=(i % 3 != 0), importance=(i % 7) / 7))
        assert s.depth("asr") <= 5
    assert s.depth("asr") == 5
    assert s.stats.submitted + s.stats.rejected_full == 50
    assert s.stats.submitted - s.stats.shed == 5


# ---- (g) admission -------------------------------------------------------------------------------------------
def costs() -> dict[str, CostModel]:
    # interactive asr: half of 0.6 s -> batch 2 -> 2/0.26 = 7.69 items/s; batch: max_batch 8 -> 8/0.74 = 10.81
    return {"asr": CostModel(c0=0.1, c1=0.08)}


def test_capacity() -> None:
    s = Scheduler(costs=costs())
    assert s.capacity("asr", "interactive") == pytest.approx(2 / 0.26)
    assert s.capacity("asr", "batch") == pytest.approx(8 / 0.74)


def admit_until_refused(s: Scheduler, slo: str, rate: float = 2.0) -> int:
    n = 0
    while s.admit(Demand(f"{slo}-{n}", slo, {"asr": rate})):
        n += 1
        assert n < 100
    return n


def test_admission_refuses_beyond_target_utilisation() -> None:
    s = Scheduler(target_utilisation=0.8, costs=costs())
    # limit 0.8 * 7.69 = 6.15 items/s: three streams of 2/s fit, the fourth does not
    assert admit_until_refused(s, "interactive") == 3
    assert sorted(s.admitted) == ["interactive-0", "interactive-1", "interactive-2"]
    assert "interactive-3" not in s.admitted
    assert not s.admit(Demand("again", "interactive", {"asr": 2.0}))
    assert "again" not in s.admitted
    assert s.admit(Demand("small", "interactive", {"asr": 0.1}))  # a lighter stream still fits


def test_looser_slo_admits_more_streams() -> None:
    interactive = admit_until_refused(Scheduler(costs=costs()), "interactive")
    batch = admit_until_refused(Scheduler(costs=costs()), "batch")
    assert (interactive, batch) == (3, 4)  # batch limit 0.8 * 10.81 = 8.65 items/s


def test_tightest_slo_governs_a_shared_model() -> None:
    s = Scheduler(costs=costs())
    assert admit_until_refused(s, "batch") == 4  # 8 items/s
    # an interactive stream would make the interactive capacity (6.15 items/s) the limit
    assert not s.admit(Demand("live", "interactive", {"asr": 0.1}))
    assert "live" not in s.admitted


def test_demands_on_other_models_do_not_interfere() -> None:
    s = Scheduler(costs={**costs(), "mt": CostModel(c0=0.1, c1=0.08)})
    assert admit_until_refused(s, "interactive") == 3
    assert s.admit(Demand("mt-only", "interactive", {"mt": 2.0}))


def test_release_frees_capacity() -> None:
    s = Scheduler(costs=costs())
    assert admit_until_refused(s, "interactive") == 3
    s.release("interactive-1")
    assert "interactive-1" not in s.admitted
    assert s.admit(Demand("new", "interactive", {"asr": 2.0}))
    assert not s.admit(Demand("newer", "interactive", {"asr": 2.0}))
    s.release("not-a-stream")  # unknown: no error


def test_drop_stream_removes_queued_items_and_admission() -> None:
    s = Scheduler(costs=costs())
    assert s.admit(Demand("a", "interactive", {"asr": 2.0}))
    assert s.admit(Demand("b", "interactive", {"asr": 2.0}))
    for sid in ("a", "b", "a"):
        s.submit(item(sid, deadline=10.0, model="asr"))
    s.submit(item("a", deadline=10.0, model="mt"))
    dropped = s.drop_stream("a")
    assert len(dropped) == 3 and all(w.stream_id == "a" for w in dropped)
    assert s.depth("asr") == 1 and s.depth("mt") == 0
    assert sorted(s.admitted) == ["b"]
    batch, _ = s.next_batch("asr", now=0.0)
    assert [w.stream_id for w in batch] == ["b"]
    assert s.drop_stream("a") == []
