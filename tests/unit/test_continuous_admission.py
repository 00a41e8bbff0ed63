"""Admission by measured cost for a continuous runner (the GPU engine, ``models.engine = "continuous"``, issue 28).

Such a runner batches on its own, so there is no batch latency to fit: before, its model was counted at no cost
and every stream offered was admitted, then almost none was served within its SLO (12 streams offered on the CPU
engine under ``serve --workers 2``: 3 within; 24: none, p99 23 s). Now each item's time from hand-over to result is
fitted against the items in flight when it was handed over, and by Little's law the model serves n / latency(n)
items/s with n in flight: admission lets streams in up to that and refuses the rest.

The runner below is a stand-in that serves one item at a time at a known rate (as a CPU decoder does): what is under
test is the executor's measure and the admission it drives. The real engine runs through the same path in
tests/service/test_gpu_engine_server.py, and ``bench/overload.py`` loads a live server with it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from fakes import SerialRunner

from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, CallContext
from lingua_fusion.serving.scheduler import (
    PACE_BUSY,
    SERVICE_MAX_IN_FLIGHT,
    SERVICE_MIN_IN_FLIGHT,
    SHAPE_GROWTH,
    CostModel,
    Demand,
    Scheduler,
)
from lingua_fusion.serving.service_curve import InFlight, ServiceCurve, step_at

KEY = ModelKey.asr("en")
MODEL = str(KEY)


def fitted(c0: float, c1: float, up_to: int) -> Scheduler:
    """A scheduler whose continuous model was seen serving items with latency c0 + c1 * n, n from 1 to ``up_to``."""
    s = Scheduler()
    s.service[MODEL] = ServiceCurve(0.2, 0.1)  # the prior a runner starts from
    sizes = sorted({*(1 << k for k in range(up_to.bit_length()) if 1 << k <= up_to), up_to})  # a sample a bucket
    for _ in range(5):
        for n in sizes:
            s.observe_service(MODEL, n, c0 + c1 * n, now=0.0)
    return s


def admitted(s: Scheduler, rate: float, slo: str = "standard") -> int:
    n = 0
    while s.admit(Demand(f"s{n}", slo, {MODEL: rate})):
        n += 1
        assert n < 10_000
    return n


def test_a_serial_runner_is_counted_at_the_rate_it_serves() -> None:
    # 0.1 s per item, one at a time: 10 items/s whatever the batch. The standard class gives ASR 1.8 s, half of
    # it to serve: 8 items in flight fit (0.05 + 0.8 = 0.85 s), so 8 / 0.85 = 9.4 items/s, 80 % of it admitted
    s = fitted(0.05, 0.1, up_to=12)
    assert s.capacity(MODEL, "standard") == pytest.approx(8 / 0.85, rel=0.05)
    assert admitted(s, rate=1.0) == 7  # 7 streams of 1 item/s fit in 0.8 x 9.4; the 8th is refused


def test_a_runner_counted_at_no_cost_admits_without_end() -> None:
    # what the executor did before: the continuous model's cost was CostModel(0, 0), so capacity had no bound
    s = Scheduler(costs={MODEL: CostModel(0.0, 0.0)})
    assert all(s.admit(Demand(f"s{n}", "standard", {MODEL: 1.0})) for n in range(2000))


def test_capacity_grows_only_as_far_as_the_runner_has_shown() -> None:
    # one item in flight seen: one size says nothing of the slope, so the prior's (0.1 s an item) stands beyond
    # it, and at most SERVICE_MIN_IN_FLIGHT are counted: 4 / (0.05 + 3 x 0.1) s
    cold = fitted(0.05, 0.0, up_to=1)
    assert cold.capacity(MODEL, "standard") == pytest.approx(SERVICE_MIN_IN_FLIGHT / 0.35, rel=0.05)
    # a flat latency up to 100 in flight (a GPU with room to spare): the fit alone would promise the engine's
    # largest batch at once; counted at most twice what it has held, it is 200 in flight, 200 / 0.05 s
    proven = fitted(0.05, 0.0, up_to=100)
    assert proven.capacity(MODEL, "standard") == pytest.approx(200 / 0.05, rel=0.05)


def test_a_runner_whose_thread_idles_is_counted_past_twice_what_it_held() -> None:
    """A fast ramp of opens: a GPU runner seen with at most 4 items in flight, each 0.1 s, flat (the warm-up's load),
    is counted at 8 in flight (80 items/s) by the growth bound alone. Its thread was busy 1 s of every 10 while it
    settled 40 items a second: 400 items a busy second, so it is counted at that pace with its thread busy
    PACE_BUSY of the time (300 items/s), which the curve allows within the budget at up to PACE_GROWTH times the 4
    it held (32 / 0.1 s). A thread busy all the time at the same rate (40 items a busy second) lifts nothing."""
    idle, busy = fitted(0.1, 0.0, up_to=4), fitted(0.1, 0.0, up_to=4)
    grown = idle.capacity(MODEL, "standard")
    assert grown == pytest.approx(8 / 0.1, rel=0.05)
    for i in range(10):
        idle.observe_service(MODEL, 4, 0.1, now=float(i), busy=(40, 0.1))
        busy.observe_service(MODEL, 4, 0.1, now=float(i), busy=(40, 1.0))
    assert idle.capacity(MODEL, "standard") == pytest.approx(400 * PACE_BUSY, rel=0.05)
    assert busy.capacity(MODEL, "standard") == pytest.approx(grown, rel=0.05)
    assert idle.service_window(MODEL) == pytest.approx(30, abs=1)  # 300 items/s x the 0.1 s an item takes (Little)
    assert busy.service_window(MODEL) == 8


def test_the_pace_never_lifts_a_runner_past_its_latency_budget() -> None:
    """A slow runner (0.65 s an item alone, 0.2 s more per item in flight: the CPU engine) whose thread idles: its
    pace says 400 items a second, but the curve puts no more than 2 in flight within half the budget (0.9 s), so
    it is counted at those 2 (2.4 items/s), as without the pace."""
    s = fitted(0.45, 0.2, up_to=2)
    before = s.capacity(MODEL, "standard")
    for i in range(10):
        s.observe_service(MODEL, 2, 0.85, now=float(i), busy=(40, 0.1))
    assert s.capacity(MODEL, "standard") == pytest.approx(before, rel=0.05)
    assert before == pytest.approx(2 / 0.85, rel=0.05) and s.service_window(MODEL) == 2


def test_a_window_reports_the_runners_busy_seconds_in_it() -> None:
    """InFlight's windows carry the items settled and the busy seconds the runner counted in them; a window
    without a reading before it (the first) carries none, and neither does a runner that counts none."""
    flight = InFlight()
    flight.hand(6, 0.0)
    assert flight.settle(0.5, 0.5, busy=lambda: 10.0) is None
    assert flight.settle(0.5, 1.0, busy=lambda: 10.2) is not None
    assert flight.busy_sample is None  # no reading before it
    assert flight.settle(0.5, 1.5, busy=lambda: 10.4) is None
    assert flight.settle(0.5, 2.0, busy=lambda: 10.5) is not None and flight.busy_sample == (2, pytest.approx(0.3))
    assert flight.settle(0.5, 3.0, busy=lambda: None) is not None and flight.busy_sample is None
    flight.hand(3, 3.0)  # a failed item is no measure of the pace: a refusal is answered at once
    assert flight.settle(None, 3.5, busy=lambda: 11.0, served=False) is None
    assert flight.settle(0.5, 4.0, busy=lambda: 11.1) is not None
    assert flight.busy_sample is None  # no reading before it
    assert flight.settle(None, 4.6, busy=lambda: 11.2, served=False) is None
    assert flight.settle(0.5, 5.0, busy=lambda: 11.3) is not None and flight.busy_sample == (1, pytest.approx(0.2))


class Timed:
    """Counts a runner's busy seconds as GpuRunner.busy_s does (serving/threads.py BusyCounted)."""

    def __init__(self, runner: SerialRunner) -> None:
        self.runner, self.busy = runner, 0.0
        seconds = runner._seconds

        def timed(n: int) -> float:
            took = seconds(n)
            self.busy += took
            return took
        runner._seconds = timed  # type: ignore[method-assign]

    def busy_s(self) -> float:
        return self.busy

    def room(self) -> int:
        return self.runner.room()

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        return self.runner.submit(payloads, tentative)

    def close(self) -> None:
        self.runner.close()


async def test_the_executor_measures_a_runners_pace_from_the_busy_seconds_it_counts() -> None:
    """Through the executor: a batching runner (a batch of n takes 0.05 + 0.02 n s) that counts its busy seconds is
    measured at the items it serves per busy second (between 20 and 50: its batches here are 1 to 16), and one that
    does not count them has no pace."""
    timed = Timed(Batching(per_item=0.0))
    executors = [Executor(None, Settings(), backends={"asr": lambda _key, r=r: r})  # type: ignore[arg-type]
                 for r in (timed, Batching(per_item=0.0))]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        for burst in (1, 4, 8, 16) * 3:
            for ex in executors:
                await asyncio.wait_for(asyncio.gather(*(
                    ex.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
        rate = executors[0].scheduler.pace[KEY].rate()
        assert rate is not None and 20 <= rate <= 52, rate
        assert KEY not in executors[1].scheduler.pace
    finally:
        for ex in executors:
            await ex.close()


def test_what_a_high_load_taught_is_not_forgotten_in_a_quiet_spell() -> None:
    # a runner (0.1 s an item alone) seen at up to 12 in flight, then a long quiet spell of one or two items at a
    # time, which it answers almost as fast as one: the next burst is admitted at what it was seen to do under
    # load. (A line fitted to the quiet spell alone has a slope near 0, and promised seven times as much.)
    s = fitted(0.0, 0.1, up_to=12)
    before = s.capacity(MODEL, "standard")
    for i in range(25):  # a quiet spell: 25 windows (seconds) at one or two in flight
        s.observe_service(MODEL, 1 + i % 2, 0.1 + 0.01 * (i % 2), now=float(i))
    assert s.capacity(MODEL, "standard") == pytest.approx(before, rel=0.05)
    assert before == pytest.approx(10.0, rel=0.05)  # 1 / 0.1 s: the rate a serial runner serves


def test_a_load_no_longer_seen_is_forgotten_and_probed_again() -> None:
    # slow once at 8-12 in flight (another job on the cores), then busy at 1-3 in flight and fast: past
    # FORGET_AFTER samples the old bucket goes, and the curve's own slope lets the window grow to probe it again
    from lingua_fusion.serving.service_curve import FORGET_AFTER

    s = fitted(0.0, 0.3, up_to=12)
    slow = s.capacity(MODEL, "standard")
    for i in range(FORGET_AFTER + 10):
        s.observe_service(MODEL, 1 + i % 3, 0.05 + 0.01 * (i % 3), now=i * 0.1)
    assert s.capacity(MODEL, "standard") > 3 * slow


def test_a_continuous_model_with_no_stream_takes_one_whatever_its_curve_says() -> None:
    s = fitted(2.0, 0.5, up_to=4)  # 2.5 s for one item: nothing fits the standard class's 0.9 s
    assert s.admit(Demand("first", "standard", {MODEL: 1.0}))  # the probe that lets the curve learn again
    assert not s.admit(Demand("second", "standard", {MODEL: 1.0}))
    s.release("first")
    assert s.admit(Demand("third", "standard", {MODEL: 1.0}))


def test_a_tighter_class_is_counted_at_the_latency_its_budget_allows() -> None:
    s = fitted(0.05, 0.1, up_to=12)
    # interactive: 0.6 s for ASR, 0.3 s to serve: 2 in flight (0.25 s), 8 items/s; standard allows 9.4
    assert s.capacity(MODEL, "interactive") == pytest.approx(2 / 0.25, rel=0.05)
    assert s.capacity(MODEL, "interactive") < s.capacity(MODEL, "standard")


class Batching(SerialRunner):
    """A ContinuousRunner that decodes everything it holds together: a batch of n takes 0.05 + 0.02 * n seconds
    (50 items/s at most, with batches as large as you like), every item of it answered at its end."""

    def _take(self) -> list[tuple[Any, Future[Any]]]:
        batch = list(self._queue)
        self._queue.clear()
        return batch

    def _seconds(self, n: int) -> float:
        return 0.05 + 0.02 * n


async def test_a_batching_runner_handed_bursts_is_counted_at_what_it_serves() -> None:
    """Handed a burst at once, a batching runner answers every item of it together. Measured by each item's place
    among those in flight at its hand-over, the last of a burst of 16 read "16 in flight take what 1 takes", and
    admission counted the runner at about 1.3x what it serves (on a live server: 35 items/s where it served 10).
    Measured in windows of the items in flight (Little's law), it is counted at no more than it serves."""
    runner = Batching(per_item=0.0)
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        for burst in (4, 8, 16) * 5:
            await asyncio.wait_for(asyncio.gather(*(
                executor.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
        capacity = executor.scheduler.capacity(KEY, "standard")
        assert 10 < capacity <= 52, capacity  # at most 50 items/s, whatever the batch
    finally:
        await executor.close()


async def test_the_executor_measures_a_continuous_runner_and_refuses_streams_beyond_it() -> None:
    runner = SerialRunner(per_item=0.02)  # 50 items/s at most
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        for burst in (1, 2, 4, 8, 16, 24):  # load as streams would bring it: more in flight each time
            outs = await asyncio.wait_for(asyncio.gather(*(
                executor.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
            assert all(o.text == "1600 samples" for o in outs)
        capacity = executor.scheduler.capacity(KEY, "standard")
        assert 10 < capacity <= 55, capacity  # about 50 items/s, less on a loaded machine, never more
        streams = 0
        with pytest.raises(Overloaded) as refused:
            while True:  # streams of 2.5 items/s: about 16 fit in 0.8 x 50
                executor.admit(Demand(f"stream-{streams}", "standard", {KEY: 2.5}))
                streams += 1
                assert streams < 100, "admission never refused"
        assert 3 <= streams <= 17, streams
        # the refusal names what is full: the client, the load generator's rejected_reasons and an operator see it
        assert refused.value.details["full"] == str(KEY) and f"({KEY} is full)" in refused.value.message
    finally:
        await executor.close()


async def test_a_continuous_runner_holds_no_more_than_admission_counts_it_at() -> None:
    """Handed everything at once, a runner queues it inside, in arrival order, and every item is late. It is
    handed only as many as its window (Scheduler.service_window); the rest wait in the scheduler, where committed
    work goes first and partials past their deadline are shed."""
    runner = SerialRunner(per_item=0.05)  # 20 items/s: 1.8 s of ASR budget at standard, half of it 18 items
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        calls = [executor.run(KEY, clip, CallContext(stream_id=f"s{i}", tentative=i % 2 == 0)) for i in range(60)]
        outs = await asyncio.wait_for(asyncio.gather(*calls), 60)
        window = executor.scheduler.service_window(KEY)
        # the window moves as the curve learns: about the items whose latency fits, never the whole queue
        assert window is not None and runner.most_held <= 2 * max(window, SERVICE_MIN_IN_FLIGHT)
        assert runner.most_held < 40  # before: all 60 handed over at once
        committed = outs[1::2]
        assert all(o is not None and o.text == "1600 samples" for o in committed)  # committed work is never shed
        assert any(o is None for o in outs[0::2])  # some partials could not make their deadline: shed, not late
    finally:
        await executor.close()


def test_a_full_window_is_given_captions_before_partials() -> None:
    # a partial handed over holds one of the runner's few places, which a caption behind it then waits for: with
    # room for two, the two committed items go first, whatever came before them
    from lingua_fusion.serving.scheduler import WorkItem

    s = Scheduler()
    items = [WorkItem(f"s{i}", MODEL, "asr", enqueued=0.0, deadline=1.8, tentative=i < 4) for i in range(6)]
    for w in items:
        assert s.submit(w)
    batch, _shed = s.next_batch(MODEL, 0.0, limit=2, committed_first=True)
    assert [w.stream_id for w in batch] == ["s4", "s5"]
    batch, _shed = s.next_batch(MODEL, 0.0, limit=8)
    assert [w.tentative for w in batch] == [True] * 4



def test_a_moment_of_slowness_moves_the_curve_by_its_share_of_the_last_seconds() -> None:
    # a runner held at 6-10 in flight for 10 s, 20 items a second, 0.05 + 0.08 s an item in flight; then one slow
    # moment (a burst of arrivals on the same cores): 5 items at 3 s. Admission still counts it near what it
    # served (a weight of 0.2 per item took its buckets half way to 3 s, and refused the burst's later streams);
    # a slowness that lasts seconds is counted within seconds
    s = Scheduler()
    for i in range(200):
        n = 6 + i % 5
        s.observe_service(MODEL, n, 0.05 + 0.08 * n, now=i * 0.05)
    before = s.capacity(MODEL, "standard")
    for n in range(6, 11):
        s.observe_service(MODEL, n, 3.0, now=10.0)
    assert s.capacity(MODEL, "standard") > 0.8 * before
    for i in range(60):  # three seconds of it
        s.observe_service(MODEL, 6 + i % 5, 3.0, now=10.0 + i * 0.05)
    assert s.capacity(MODEL, "standard") < 0.5 * before


def test_an_idle_runner_keeps_what_the_last_load_taught() -> None:
    # 5 s at 6-10 in flight, 1.3 s an item (past the standard budget's 0.9 s); the streams end; 20 s later the next
    # load's first items come back fast on the quiet cores. Counted by their promise, the runner took 20 streams
    # that all missed their target; the idle gap counts as MAX_GAP_S of use, so the load's lesson stays
    s = Scheduler()
    for i in range(100):
        s.observe_service(MODEL, 6 + i % 5, 1.3, now=i * 0.05)
    before = s.capacity(MODEL, "standard")
    for i in range(4):
        s.observe_service(MODEL, 4 + i % 2, 0.5, now=25.0 + i * 0.1)
    assert s.capacity(MODEL, "standard") < 1.25 * before


def test_a_load_carried_within_budget_is_never_refused_below() -> None:
    # 8 streams of 0.55 items/s carried for 6 s, each item 1.1 s (within 0.8 of the standard ASR budget, 1.8 s);
    # then the curve's promise falls for a moment (a burst's handshakes on the cores): the load that was carried
    # is still admitted, and no more than the curve allows beyond it
    s = Scheduler()
    rate = {MODEL: 0.55}
    s.admitted.update({f"s{n}": Demand(f"s{n}", "standard", dict(rate)) for n in range(8)})
    for i in range(130):
        s.observe_service(MODEL, 5, 1.1, now=i * 0.05)
    assert s.proven[MODEL].floor == pytest.approx(8 * 0.55)
    for n in range(1, 13):
        s.observe_service(MODEL, n, 3.0, now=6.6)  # a slow moment: the curve alone would take one stream
    assert s.capacity(MODEL, "standard") * s.target_utilisation < 0.55
    for n in range(8):
        s.release(f"s{n}")
    admitted = [s.admit(Demand(f"b{n}", "standard", dict(rate))) for n in range(12)]
    assert sum(admitted) == 8


def test_a_floor_learnt_under_a_larger_charge_per_stream_admits_no_more_streams_than_were_carried() -> None:
    # 8 streams carried while each was charged 0.5 items/s beyond its declared 0.55 (serving/rates.py); then the
    # meter's charge falls to nothing: the floor is those 8 streams, not 8.4 items/s worth of 0.55-streams (15)
    s = Scheduler()
    rate = {MODEL: 0.55}
    s.admitted.update({f"s{n}": Demand(f"s{n}", "standard", dict(rate)) for n in range(8)})
    s.demand_extra[MODEL] = 0.5
    for i in range(130):
        s.observe_service(MODEL, 5, 1.1, now=i * 0.05)
    assert s.proven[MODEL].at(0.5) == pytest.approx(8 * 1.05)
    for n in range(1, 13):
        s.observe_service(MODEL, n, 3.0, now=6.6)  # the curve alone would take one stream
    s.demand_extra[MODEL] = 0.0
    for n in range(8):
        s.release(f"s{n}")
    admitted = [s.admit(Demand(f"b{n}", "standard", dict(rate))) for n in range(16)]
    assert sum(admitted) == 8


def test_a_load_served_late_is_no_floor() -> None:
    s = Scheduler()
    s.admitted.update({f"s{n}": Demand(f"s{n}", "standard", {MODEL: 0.55}) for n in range(8)})
    for i in range(130):
        s.observe_service(MODEL, 5, 1.6, now=i * 0.05)  # within the budget (1.8 s) but not healthy (> 0.8 of it)
    assert s.proven[MODEL].floor == 0.0
    for i in range(130):
        s.observe_service(MODEL, 5, 1.0, now=7.0 + i * 0.05)
    assert s.proven[MODEL].floor == pytest.approx(8 * 0.55)
    for i in range(40):
        s.observe_service(MODEL, 5, 4.0, now=14.0 + i * 0.05)  # over the budget: the floor goes
    assert s.proven[MODEL].floor == 0.0


async def test_items_that_waited_on_the_runners_build_do_not_teach_admission() -> None:
    # a GPU engine builds an MT runner at its first call: every item handed over meanwhile waits for the build.
    # Those items' seconds are not the runner's: admission counts it at what it serves once built
    runner = SerialRunner(per_item=0.02, build_s=4.0)  # 50 items/s once built
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        await asyncio.wait_for(asyncio.gather(*(
            executor.run(KEY, clip, CallContext(stream_id=f"cold-{i}")) for i in range(12))), 30)
        assert runner.built.is_set()
        for burst in (1, 2, 4, 8) * 6:  # 1.8 s of work: a window or more of samples
            await asyncio.wait_for(asyncio.gather(*(
                executor.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
        svc = executor.scheduler.service[KEY]
        # the items that waited the build's 4 s are in no sample: a few in flight take about 0.1 s (with the items
        # that waited counted, a window of them took 4 s)
        assert svc._points and max(p.latency for p in svc._points.values()) < 0.25, svc._points
    finally:
        await executor.close()


def test_a_runner_busy_in_short_spells_still_gives_samples() -> None:
    """One batch-class stream: 0.3 s of work every 1.5 s. Its idle time is no part of a window, so windows fill
    with its busy time (before: a window reset at each idle spell, and no sample came at all)."""
    flight, samples = InFlight(), []
    for k in range(10):
        t = 100.0 + 1.5 * k
        flight.hand(3, t)  # three items decoded together, answered 0.3 s later
        for _ in range(3):
            sample = flight.settle(0.3, t + 0.3)
            if sample is not None:
                samples.append(sample)
    assert len(samples) >= 2
    assert all(n == pytest.approx(3.0, rel=0.05) and latency == pytest.approx(0.3) for n, latency in samples)


def test_a_window_of_failures_gives_no_sample_and_is_not_carried() -> None:
    flight = InFlight()
    for k in range(50):  # 50 s of items that all fail
        flight.hand(1, float(k))
        assert flight.settle(None, k + 0.5) is None
    flight.hand(2, 50.0)  # then the runner serves again: two items, answered 0.2 and 1.2 s later
    assert flight.settle(0.2, 50.2) is None
    # this window's own: 2 in flight for 0.2 s and 1 for 1 s over its 1.2 s, not a mean over the failures' 50 s
    assert flight.settle(1.2, 51.2) == pytest.approx(((2 * 0.2 + 1.0) / 1.2, 0.7))


# ---- a runner that timed its own step at each batch size (the GPU engine's CUDA graphs) ----------------------
GPU_STEP = ((8, 0.0012), (16, 0.0012), (32, 0.0013), (64, 0.0014), (128, 0.0016), (256, 0.0021), (512, 0.0035),
            (1024, 0.006))  # seconds a decode step of each batch size (the H100's order of size)


def test_a_step_of_n_rows_costs_what_the_smallest_bucket_holding_them_costs() -> None:
    assert step_at(GPU_STEP, 1) == step_at(GPU_STEP, 8) == 0.0012  # fewer rows than the smallest graph: its cost
    assert step_at(GPU_STEP, 100) == 0.0016  # 100 rows replay the graph of 128
    assert step_at(GPU_STEP, 2048) == pytest.approx(0.012)  # twice the largest batch: two steps' worth
    assert step_at(((8, 0.002), (16, 0.001)), 12) == 0.002  # a noisy timing never makes more rows faster


def light_load(shape: tuple[tuple[int, float], ...] = ()) -> Scheduler:
    """A GPU runner under a light load of the interactive class, as on the H100: one to three items in flight, 30
    and 45 ms (arrivals bunching), its step's timings ``shape``."""
    s = Scheduler()
    s.service[MODEL] = ServiceCurve(0.07, 0.08)  # tiny.en's prior (serving/demand.py)
    for i in range(10):
        s.observe_service(MODEL, 1 + (i % 2) * 2, 0.03 + (i % 2) * 0.015, now=float(i), shape=shape)
    assert s.admit(Demand("first", "interactive", {MODEL: 1.0}))  # its window is the class's: ASR's 0.3 s to serve
    return s


def test_a_light_load_on_a_runner_with_its_step_timed_is_counted_at_what_its_batches_carry() -> None:
    """The slope through 1 and 3 items in flight (7.5 ms an item) held an H100's runners to a few items in flight
    while their threads idled. With the step's own timings the curve is extrapolated as a batcher's: a step of 24
    rows costs 1.3 ms where one of 3 costs 1.2, so SHAPE_GROWTH x 3 = 24 items in flight at 45 ms x 13/12."""
    slope, timed = light_load(), light_load(GPU_STEP)
    before, after = slope.capacity(MODEL, "interactive"), timed.capacity(MODEL, "interactive")
    assert before == pytest.approx(6 / (0.045 + 3 * 0.0075), rel=0.01)  # twice the 3 held, along the slope
    assert after == pytest.approx(24 / (0.045 * 13 / 12), rel=0.01)
    assert timed.service_window(MODEL) == int(SHAPE_GROWTH * 3)


def test_a_runner_whose_step_grows_with_its_rows_is_held_to_its_latency_budget() -> None:
    """A step timed at 4 ms a row (a decoder on the CPU, or past the GPU's knee): the timings lift nothing
    beyond what fits half the stage budget (the interactive class's ASR: 0.3 s)."""
    linear = tuple((b, 0.004 * b) for b in (1, 2, 4, 8, 16, 32))
    s = light_load(linear)
    n = s.service_window(MODEL)
    assert n is not None and n < SHAPE_GROWTH * 3
    assert s.service[MODEL].predict(n) <= 0.3 < s.service[MODEL].predict(n + 1)
    assert s.capacity(MODEL, "interactive") == pytest.approx(n / s.service[MODEL].predict(n))


def test_what_the_timings_promise_is_grown_into_a_factor_at_a_time() -> None:
    """Each window the runner holds more, the count it is allowed grows with it, to the budget and no further."""
    s = light_load(GPU_STEP)
    allowed = []
    for i in range(5):
        n = s.service_window(MODEL)
        assert n is not None
        allowed.append(n)
        for _ in range(3):  # the runner holds what it is allowed, each item at 45 ms x its step's growth
            s.observe_service(MODEL, n, 0.045 * step_at(GPU_STEP, n) / 0.0012, now=10.0 + i, shape=GPU_STEP)
    assert allowed[:3] == [24, 192, SERVICE_MAX_IN_FLIGHT]  # 1,024 rows: 0.225 s, within 0.3
    assert allowed[-1] == SERVICE_MAX_IN_FLIGHT


class Profiled(Batching):
    """A batching runner that says what its step takes at each batch size (GpuRunner.step_profile)."""

    def step_profile(self) -> tuple[tuple[int, float], ...]:
        return ((8, 0.05), (16, 0.06))


async def test_the_executor_extrapolates_a_runner_by_the_step_timings_it_reports() -> None:
    runner, plain = Profiled(per_item=0.0), Batching(per_item=0.0)
    executors = [Executor(None, Settings(), backends={"asr": lambda _key, r=r: r})  # type: ignore[arg-type]
                 for r in (runner, plain)]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        for burst in (4, 8) * 8:  # a few seconds: windows of the items in flight are 1 s (service_curve.WINDOW_S)
            for ex in executors:
                await asyncio.wait_for(asyncio.gather(*(
                    ex.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
        assert executors[0].scheduler.service[KEY].shape == ((8, 0.05), (16, 0.06))
        assert executors[1].scheduler.service[KEY].shape == ()
    finally:
        for ex in executors:
            await ex.close()


def test_each_batch_size_is_timed_at_its_fastest_after_a_warm_run() -> None:
    """A step's timing (serving/gpu/graphs.py time_each): one untimed run (kernels chosen), then the least of the
    timed runs, each ended by the device's sync: another process's kernels on the GPU only ever add to it."""
    from lingua_fusion.serving.gpu.graphs import time_each

    now = [0.0]
    took = {8: [9.0, 0.002, 0.003, 0.0025], 16: [9.0, 0.004, 0.0035, 0.005]}  # the first: the warm run
    ran: list[int] = []

    def run(size: int) -> None:
        ran.append(size)
        now[0] += took[size].pop(0)

    synced: list[int] = []
    timed = time_each([8, 16], run, lambda: synced.append(len(ran)), repeats=3, clock=lambda: now[0])
    assert timed == ((8, pytest.approx(0.002)), (16, pytest.approx(0.0035)))
    assert ran == [8] * 4 + [16] * 4 and synced == list(range(1, 9))  # each run ended by a sync before its time


def test_a_load_whose_measure_was_forgotten_is_probed_again_from_what_the_curve_still_knows() -> None:
    """Seen at 128 in flight taking 0.25 s, then a long light spell at 2 (45 ms): past FORGET_AFTER windows the
    128 bucket goes. The step timings would stretch the light spell's 45 ms to 128 rows as 60 ms (they leave out
    attention over a real context); so growth starts again from the 2 the curve still knows, 8x a measure, not from
    the 128 it once held."""
    from lingua_fusion.serving.service_curve import FORGET_AFTER

    s = Scheduler()
    s.service[MODEL] = ServiceCurve(0.07, 0.08)
    for i in range(20):
        s.observe_service(MODEL, 128, 0.25, now=float(i), shape=GPU_STEP)
    for i in range(FORGET_AFTER + 10):
        s.observe_service(MODEL, 2, 0.045, now=20.0 + i, shape=GPU_STEP)
    assert s.admit(Demand("first", "interactive", {MODEL: 1.0}))
    assert s.service_window(MODEL) == int(SHAPE_GROWTH * 2)
    assert s.capacity(MODEL, "interactive") == pytest.approx(16 / 0.045, rel=0.01)
