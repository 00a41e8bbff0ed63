"""Admission counts a stream at the committed work it was measured to ask (serving/rates.py), not only at its
declared rate.

On an H100 the product's streams committed 0.42 utterances a second where 0.3 was reserved, and a fast ramp was
admitted to 944 streams where 689 could be served in time (352 were).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest
from fakes import SerialRunner

from lingua_fusion.config import Settings
from lingua_fusion.observability import Metrics
from lingua_fusion.serving.cost_model import CostModel
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import FILE_CLASS, AsrInput, AsrOutput, CallContext
from lingua_fusion.serving.rates import COMMITTED_RATE, MAX_SCALE, SETTLE_S, WINDOW_S, DemandMeter
from lingua_fusion.serving.scheduler import Demand, Scheduler
from lingua_fusion.serving.service_curve import ProvenLoad

pytestmark = pytest.mark.timeout(60)
KEY = ModelKey.asr("en")


def talk(meter: DemandMeter[str], streams: list[str], per_s: float, start: float, end: float) -> dict[str, float]:
    """Each of ``streams`` submits ``per_s`` committed items a second to "asr" from ``start`` to ``end``; every
    model's ``extra`` at the last window's end."""
    scales: dict[str, float] = {}
    steps = round((end - start) * per_s)
    events = sorted((start + (k + (i + 0.5) / len(streams)) / per_s, s)  # spread out, as streams' speech is
                    for k in range(steps) for i, s in enumerate(streams))
    for now, s in events:
        scales = meter.submitted("asr", s, now) or scales
    return {**scales, **meter.tick(end)}


def admitted_at_zero(n: int, models: tuple[str, ...] = ("asr",), prefix: str = "s"
                     ) -> tuple[DemandMeter[str], list[str]]:
    """A meter with ``n`` streams on ``models`` admitted at 0 (settled from SETTLE_S)."""
    meter: DemandMeter[str] = DemandMeter(now=0.0)
    streams = [f"{prefix}{i}" for i in range(n)]
    for s in streams:
        meter.admitted(s, models, 0.0)
    return meter, streams


def test_streams_louder_than_declared_are_counted_as_loud_as_they_are() -> None:
    meter, streams = admitted_at_zero(10, ("asr", "mt"))
    assert meter.scale("asr") == 1.0  # nothing measured yet: as declared
    talk(meter, streams, 0.6, start=0.0, end=SETTLE_S)  # their first seconds are not counted
    assert meter.scale("asr") == 1.0
    extra = talk(meter, streams, 0.6, start=SETTLE_S, end=SETTLE_S + 10 * WINDOW_S)
    assert meter.scale("asr") == pytest.approx(0.6 / COMMITTED_RATE, rel=0.1)
    assert extra["asr"] == pytest.approx(0.6 - COMMITTED_RATE, rel=0.1)  # what admission adds to each stream
    assert meter.scale("mt") == 1.0  # asked nothing of MT: never counted below its reservation


def test_a_quiet_stream_keeps_its_reservation_and_a_runaway_one_is_capped() -> None:
    meter, quiet = admitted_at_zero(10, prefix="q")
    talk(meter, quiet, 0.1, start=SETTLE_S, end=SETTLE_S + 10 * WINDOW_S)
    assert meter.scale("asr") == 1.0  # it may start talking
    loud, _ = admitted_at_zero(10, prefix="q")
    talk(loud, quiet, 5.0, start=SETTLE_S, end=SETTLE_S + 10 * WINDOW_S)
    assert loud.scale("asr") == MAX_SCALE


def test_a_ramp_of_new_streams_does_not_dilute_the_rate() -> None:
    # a new stream asks nothing for its first seconds: counted from its open, a ramp would halve the measure just
    # when admission needs it
    meter, settled = admitted_at_zero(10)
    talk(meter, settled, 0.6, start=SETTLE_S, end=SETTLE_S + 4 * WINDOW_S)
    before = meter.scale("asr")
    at = SETTLE_S + 4 * WINDOW_S
    for i in range(200):
        meter.admitted(f"new{i}", ["asr"], at)
    talk(meter, settled, 0.6, start=at, end=at + 2 * WINDOW_S)
    assert before > 1.5 and meter.scale("asr") == pytest.approx(before, rel=0.05)


def test_a_stream_released_in_a_window_still_counts_its_seconds() -> None:
    meter: DemandMeter[str] = DemandMeter(now=0.0)
    streams = [f"s{i}" for i in range(20)]
    for s in streams:
        meter.admitted(s, ["asr"], -SETTLE_S)  # settled from 0
    for s in streams:  # each asks one item in the window's first second, then half of them end
        meter.submitted("asr", s, 0.5)
    for s in streams[:10]:
        meter.released(s, 1.0)
    meter.tick(WINDOW_S)
    # 20 items over 10 streams x 1 s + 10 x 2 s = 30 stream-seconds, not over the 20 of those still open
    assert meter.scale("asr") == pytest.approx((20 / 30) / COMMITTED_RATE)


def taken(declared: float, extra: float) -> int:
    """Streams declaring ``declared`` items/s of "asr" a scheduler admits, each charged ``extra`` more."""
    scheduler: Scheduler[str] = Scheduler(max_batch=8)
    scheduler.costs["asr"] = CostModel(0.05, 0.01)  # measured: a batch of 8 in 0.13 s, about 60 items/s
    scheduler.demand_extra["asr"] = extra
    n = 0
    while scheduler.admit(Demand(f"s{n}", "standard", {"asr": declared})):
        n += 1
    return n


def test_admission_adds_what_each_stream_was_measured_to_ask_beyond_its_declared_rate() -> None:
    # each stream commits twice what it declared
    declared, measured = taken(COMMITTED_RATE, 0.0), taken(COMMITTED_RATE, COMMITTED_RATE)
    assert declared > 20
    assert measured == pytest.approx(declared / 2, abs=1)


def test_only_the_committed_part_is_scaled_not_the_partials() -> None:
    # partials follow speech time and the partial pace, and are shed first: a stream declaring 0.3 committed and
    # 0.5 tentative items a second that commits twice as often asks 0.3 more, not 0.8 more
    meter, streams = admitted_at_zero(10)
    talk(meter, streams, 2 * COMMITTED_RATE, start=SETTLE_S, end=SETTLE_S + 10 * WINDOW_S)
    assert meter.scale("asr") == pytest.approx(2.0, rel=0.1)
    assert meter.extra("asr") == pytest.approx(COMMITTED_RATE, rel=0.1)
    with_partials = taken(COMMITTED_RATE + 0.5, meter.extra("asr"))
    assert with_partials == taken(COMMITTED_RATE + 0.5 + meter.extra("asr"), 0.0)  # 1.1 a stream ...
    assert with_partials > taken(2 * (COMMITTED_RATE + 0.5), 0.0)  # ... not the whole rate doubled, 1.6


def test_a_loud_spell_does_not_outlive_its_streams() -> None:
    # without a sample (fewer than MIN_STREAM_S settled stream-seconds in a window) the measure goes back towards
    # the declared rate: a loud spell's 4x must not hold a small server to a quarter of its streams for ever
    meter, loud = admitted_at_zero(10)
    talk(meter, loud, 5.0, start=SETTLE_S, end=SETTLE_S + 4 * WINDOW_S)
    assert meter.scale("asr") == MAX_SCALE
    at = SETTLE_S + 4 * WINDOW_S
    for s in loud[1:]:
        meter.released(s, at)
    for k in range(1, 31):  # one quiet stream left, a minute of windows
        meter.tick(at + k * WINDOW_S)
    assert meter.scale("asr") < 1.1


@contextlib.asynccontextmanager
async def executor_at(clock: list[float], metrics: Metrics | None = None) -> AsyncIterator[Executor]:
    executor = Executor(None, Settings(), metrics, clock=lambda: clock[0],  # type: ignore[arg-type]
                        backends={"asr": lambda _key: SerialRunner(per_item=0.001)})
    try:
        yield executor
    finally:
        await executor.close()


async def test_the_executor_measures_what_admitted_streams_commit_and_admission_counts_it() -> None:
    clock = [100.0]
    clip = AsrInput(np.zeros(1600, np.float32))
    metrics = Metrics()
    async with executor_at(clock, metrics) as executor:
        streams = [f"s{i}" for i in range(10)]
        executor.scheduler.proven[KEY] = ProvenLoad(floor=1_000.0)  # admitted whatever the runner's prior says
        for s in streams:
            executor.admit(Demand(s, "interactive", {KEY: COMMITTED_RATE}))
        clock[0] += SETTLE_S
        for _ in range(3):  # three windows, each stream committing 2 utterances a window (1 a second)
            for ctx in [CallContext(stream_id=s, slo="interactive") for s in streams for _ in range(2)]:
                await asyncio.wait_for(executor.run(KEY, clip, ctx), 10)
            # tentative re-decodes and a file's pieces in the same windows are not a stream's committed work
            await asyncio.wait_for(executor.run(KEY, clip, CallContext(stream_id="s0", tentative=True)), 10)
            await asyncio.wait_for(executor.run(KEY, clip, CallContext(stream_id="s0", slo=FILE_CLASS)), 10)
            clock[0] += WINDOW_S
        executor.admit(Demand("late", "interactive", {KEY: COMMITTED_RATE}))  # an admission closes the window too
        # (the windows close where items and admissions fall, so a window's edge moves an item or two)
        assert executor.scheduler.demand_extra[KEY] == pytest.approx(1.0 - COMMITTED_RATE, rel=0.05)
        shown = metrics.registry.get_sample_value("linguafusion_demand_scale", {"model": str(KEY)})
        assert shown == pytest.approx(1.0 / COMMITTED_RATE, rel=0.05)  # on /metrics, for an operator
        executor.release("s0")  # its seconds to its end still count; after, it is no stream
        assert "s0" not in executor.meter._streams


async def test_a_retried_caption_counts_once_and_a_readmitted_stream_at_once() -> None:
    clock = [100.0]
    clip = AsrInput(np.zeros(1600, np.float32))
    async with executor_at(clock) as executor:
        executor.scheduler.proven[KEY] = ProvenLoad(floor=1_000.0)
        streams = [f"s{i}" for i in range(10)]
        for s in streams:  # re-registered by their workers after this model process restarted: settled already
            executor.readmit(Demand(s, "interactive", {KEY: COMMITTED_RATE}))
        assert set(executor.scheduler.admitted) == set(streams)
        calls, seen = 0, 0

        def flaky(payloads: list[object]) -> list[object]:  # every window's first batch fails: its captions retried
            nonlocal calls, seen
            calls, seen = calls + 1, seen + len(payloads)
            if calls % 4 == 1:
                raise RuntimeError("transient")
            return [AsrOutput("words", 0.9)] * len(payloads)
        assert KEY not in executor._runners  # made at its first call below, from this backend
        executor.backends["asr"] = lambda _key: flaky
        for _ in range(3):  # each stream commits 2 a window, at once (their retries wait together)
            calls = 0
            await asyncio.wait_for(asyncio.gather(*(executor.run(KEY, clip, CallContext(stream_id=s, slo="interactive"))
                                                    for s in streams for _ in range(2))), 10)
            clock[0] += WINDOW_S
        executor.admit(Demand("late", "interactive", {KEY: COMMITTED_RATE}))
        assert seen > 60  # captions were sent again ...
        assert executor.scheduler.demand_extra[KEY] == pytest.approx(1.0 - COMMITTED_RATE, rel=0.05)  # ... once
