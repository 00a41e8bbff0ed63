"""Fair sharing between API keys, pure cores with hand-made items and a fake clock (``now`` passed in):
the scheduler's model batches (start-time fair queueing on work units) and the file-request admission queue
(FairQueue); then the executor, with a recording MT runner, passing each stream's key through CallContext."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from lingua_fusion.api.admission import FairQueue
from lingua_fusion.config import Settings
from lingua_fusion.serving.demand import MT_BATCH_CHARS
from lingua_fusion.serving.executor import VAD_BATCH_S, Executor
from lingua_fusion.serving.fair import round_robin
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import CallContext, MtInput
from lingua_fusion.serving.scheduler import CostModel, Scheduler, WorkItem


def mt(key: str, units: float, *, deadline: float = 100.0, enqueued: float = 0.0, payload: Any = None,
       tentative: bool = False) -> WorkItem:
    return WorkItem(stream_id=f"st-{key}", model="mt:en-es", stage="mt", enqueued=enqueued, deadline=deadline,
                    key_id=key, units=units, payload=payload, tentative=tentative)


def scheduler(**kw: Any) -> Scheduler:
    s = Scheduler(max_batch=8, costs={"mt:en-es": CostModel(c0=0.05, c1=0.01)}, **kw)
    s.batch_scale = {"mt": 4}
    return s


def drain(s: Scheduler, now: float = 0.0) -> list[list[WorkItem]]:
    batches = []
    while True:
        batch, _ = s.next_batch("mt:en-es", now)
        if not batch:
            return batches
        batches.append(batch)


# ---- the scheduler: one key's flood against another key's caption ------------------------------------------
def test_a_caption_goes_before_another_keys_flood() -> None:
    s = scheduler()
    s.max_units = {"mt": 8000}
    for i in range(40):  # key A: 40 messages of 19,000 characters, queued first
        assert s.submit(mt("A", 19_000, payload=f"A{i}"))
    assert s.submit(mt("B", 6, payload="caption"))
    first, _ = s.next_batch("mt:en-es", 0.0)
    assert [w.payload for w in first] == ["A0"]  # A's first item: nothing served yet, and it came first
    second, _ = s.next_batch("mt:en-es", 0.0)
    assert second[0].payload == "caption"  # then B: its start tag (0) is below A's (19,000)


def test_a_batch_holds_at_most_max_units_but_always_one_item() -> None:
    s = scheduler()
    s.max_units = {"mt": 8000}
    for i in range(10):
        s.submit(mt("A", 3000, payload=i))
    s.submit(mt("B", 20_000, payload="big"))
    for batch in drain(s):
        total = sum(w.units for w in batch)
        assert total <= 8000 or len(batch) == 1, [w.payload for w in batch]


def test_backlogged_keys_share_by_units() -> None:
    s = scheduler(max_queue=1000)
    for i in range(200):
        assert s.submit(mt("A", 100, payload=("A", i)))
        assert s.submit(mt("B", 10, payload=("B", i)))
    served = {"A": 0.0, "B": 0.0}
    for batch in drain(s)[:6]:  # while both are backlogged (B's 200 items last about 7 batches of 32)
        for w in batch:
            served[w.key_id] += w.units
    assert abs(served["A"] - served["B"]) <= 100  # equal shares, to within one item


def test_an_idle_key_banks_no_credit() -> None:
    s = scheduler()
    s.max_batch = 1  # one item a batch: the order is the fair order
    for i in range(50):
        s.submit(mt("A", 10, payload=("A", i)))
    for _ in range(30):  # A alone for a while
        s.next_batch("mt:en-es", 0.0)
    for i in range(5):
        s.submit(mt("B", 10, payload=("B", i)))
    order = [b[0].key_id for b in drain(s)[:10]]
    # B is served at once but then shares with A turn about: it did not bank A's 30 items as credit
    assert order[0] == "B" and order[:10].count("B") <= 6 and "A" in order[:4], order


def test_within_a_key_the_score_still_orders() -> None:
    s = scheduler()
    s.max_batch = 1
    s.submit(mt("A", 10, deadline=50.0, payload="later"))
    s.submit(mt("A", 10, deadline=1.0, payload="sooner"))
    assert [b[0].payload for b in drain(s)] == ["sooner", "later"]


def test_one_key_holds_at_most_its_share_of_the_queue() -> None:
    s = scheduler(max_queue=8)
    s.max_queue_per_key = 4
    assert all(s.submit(mt("A", 1)) for _ in range(4))
    assert not s.submit(mt("A", 1))  # committed work of a key at its share: refused (the caller says overloaded)
    assert s.submit(mt("B", 1))  # another key still gets in
    assert s.submit(mt("A", 1, tentative=True)) is False  # nor does A's tentative work displace anyone


def test_a_key_at_its_share_displaces_only_its_own_tentative_work() -> None:
    s = scheduler(max_queue=8)
    s.max_queue_per_key = 2
    s.submit(mt("B", 1, tentative=True, payload="B's"))
    s.submit(mt("A", 1, payload="a1"))
    s.submit(mt("A", 1, tentative=True, payload="a-tentative"))
    assert s.submit(mt("A", 1, payload="a2"))
    left = [w.payload for w in s.queues["mt:en-es"]]
    assert "a-tentative" not in left and "B's" in left


def test_round_robin_takes_keys_in_turn_within_the_units() -> None:
    items = [("A", 100.0, "a1"), ("A", 100.0, "a2"), ("B", 0.5, "b1"), ("C", 1.0, "c1"), ("A", 1.0, "a3")]
    taken, left = round_robin(items, lambda it: it[0], lambda it: it[1], max_items=10, max_units=120.0)
    assert [it[2] for it in taken] == ["a1", "b1", "c1"] and [it[2] for it in left] == ["a2", "a3"]
    taken, left = round_robin(left, lambda it: it[0], lambda it: it[1], max_items=10, max_units=120.0)
    assert [it[2] for it in taken] == ["a2", "a3"] and left == []
    taken, _ = round_robin([("A", 500.0, "huge")], lambda it: it[0], lambda it: it[1], max_items=10, max_units=1)
    assert [it[2] for it in taken] == ["huge"]  # one item always fits
    taken, left = round_robin(items, lambda it: it[0], lambda it: it[1], max_items=2, max_units=1e9)
    assert [it[2] for it in taken] == ["a1", "b1"] and len(left) == 3


# ---- FairQueue: file requests ----------------------------------------------------------------------------------
def test_fair_queue_gives_a_newcomer_a_place_and_the_next_slot() -> None:
    q = FairQueue(running_limit=1, waiting_limit=2)
    a1, _ = q.arrive("A")
    a2, _ = q.arrive("A")
    a3, _ = q.arrive("A")
    assert a1 is not None and a1.granted and a2 is not None and a3 is not None and not a2.granted
    b1, displaced = q.arrive("B")  # the room is full: B takes A's newest place
    assert b1 is not None and displaced is a3 and a3.refused
    assert q.leave(a1) == [b1]  # the freed slot goes to B (never served), not to A's older request
    assert q.leave(b1) == [a2]
    assert q.leave(a2) == [] and q.running_total() == 0 and q.waiting_total() == 0


def test_fair_queue_refuses_the_heaviest_keys_newcomer() -> None:
    q = FairQueue(running_limit=1, waiting_limit=2)
    q.arrive("A")
    q.arrive("A")
    q.arrive("B")
    ticket, displaced = q.arrive("A")  # A already holds as many places as anyone: refused, nobody displaced
    assert ticket is None and displaced is None


def test_fair_queue_a_waiter_that_gives_up_leaves_no_trace() -> None:
    q = FairQueue(running_limit=1, waiting_limit=4)
    a1, _ = q.arrive("A")
    b1, _ = q.arrive("B")
    assert a1 is not None and b1 is not None
    assert q.leave(b1) == []  # B gave up waiting (client gone, or its time limit)
    assert q.waiting_total() == 0
    assert q.leave(a1) == [] and q.running_total() == 0


# ---- the executor passes each stream's key to the scheduler ----------------------------------------------------
async def test_executor_shares_the_mt_worker_between_keys() -> None:
    started, release = threading.Event(), threading.Event()
    batches: list[list[str]] = []

    def runner(items: list[MtInput]) -> list[str]:
        batches.append([it.text[:2] for it in items])
        started.set()
        release.wait(30)  # the first batch holds the worker while the others queue
        return [it.text for it in items]

    s = Settings()
    ex = Executor(None, s, backends={"mt": lambda key: runner})  # type: ignore[arg-type]
    key = ModelKey.mt("en", "es")
    flood = [asyncio.create_task(ex.run(key, MtInput(f"A{i:02d}" + "x" * 19_000), CallContext(f"a{i}", key_id="A")))
             for i in range(12)]
    await asyncio.to_thread(started.wait, 30)
    caption = asyncio.create_task(ex.run(key, MtInput("B: hello"), CallContext("b", key_id="B")))
    await asyncio.sleep(0.05)  # B's item is queued behind A's eleven
    release.set()
    assert (await caption) == "B: hello"
    await asyncio.gather(*flood)
    await ex.close()
    assert batches[0] == ["A0"]
    assert batches[1][0] == "B:"  # the next batch after the running one starts with B's caption
    assert all(len(b) == 1 for b in batches[2:])  # A's 19,000-character items: one a batch (MT_BATCH_CHARS)
    assert MT_BATCH_CHARS < 19_000


async def test_executor_shares_the_vad_thread_between_keys() -> None:
    """Key A's streams send 100 s PCM messages; key B's stream a quarter second. B's windows go in the next VAD call
    after the one running, and no call holds more than VAD_BATCH_S of audio besides its first item."""
    started, release = threading.Event(), threading.Event()
    calls: list[list[float]] = []

    def runner(windows: list[np.ndarray]) -> list[np.ndarray]:
        calls.append([len(w) / 16000 for w in windows])
        started.set()
        release.wait(30)
        return [np.zeros(len(w) // 512, dtype=np.float32) for w in windows]

    ex = Executor(None, Settings(), backends={"vad": lambda key: runner})  # type: ignore[arg-type]
    vad = ModelKey.vad()
    first = asyncio.create_task(ex.run(vad, np.zeros(1600, dtype=np.float32), CallContext("a0", key_id="A")))
    await asyncio.to_thread(started.wait, 30)
    flood = [asyncio.create_task(ex.run(vad, np.zeros(100 * 16000, dtype=np.float32),
                                        CallContext(f"a{i}", key_id="A"))) for i in range(1, 4)]
    small = asyncio.create_task(ex.run(vad, np.zeros(4000, dtype=np.float32), CallContext("b", key_id="B")))
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(first, small, *flood)
    await ex.close()
    assert calls[1] == [100.0, 0.25]  # A's next stream and B's, then the other two of A's, one call each
    assert calls[2:] == [[100.0], [100.0]] and VAD_BATCH_S < 200


async def test_work_past_its_deadline_is_answered_504_and_keeps_its_slot(monkeypatch: Any) -> None:
    """A thread cannot be cancelled: the caller gets 504 by the deadline (plus a grace), while the slot stays taken
    until the thread returns, so work that overruns still counts against the bound on concurrent work."""
    import lingua_fusion.api.admission as admission
    from lingua_fusion.deadline import Deadline
    from lingua_fusion.errors import Overloaded, RequestTimeout
    from lingua_fusion.observability import Metrics

    monkeypatch.setattr(admission, "GRACE_S", 0.1)
    a = admission.Admission(1, 0, Metrics())
    release = threading.Event()
    try:
        await a.run("A", Deadline(0.05), lambda: release.wait(30))
        raise AssertionError("no timeout")
    except RequestTimeout as exc:
        assert exc.status == 504
    assert a.queue.running_total() == 1  # the thread still runs, in its slot
    try:
        await a.run("B", Deadline(5.0), lambda: "never")
        raise AssertionError("admitted beyond the bound")
    except Overloaded:
        pass
    release.set()
    for _ in range(200):  # the slot comes back once the thread has returned
        if a.queue.running_total() == 0:
            break
        await asyncio.sleep(0.01)
    assert await a.run("B", Deadline(5.0), lambda: "ran") == "ran"
