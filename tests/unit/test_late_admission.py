"""A model owing a caption past its stage's budget takes no more streams (serving/late.py), whatever its measures
promise.

On an H100 a ramp of 900 opens in 5 s was admitted up to 755 streams while the runners' items were already late
(333 met their target): the latency curve learns from items as they settle, a second or more behind. An item still
owed past its deadline is known at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from fakes import SerialRunner

from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.late import Owed
from lingua_fusion.serving.ports import FILE_CLASS, AsrInput, CallContext
from lingua_fusion.serving.scheduler import Demand
from lingua_fusion.serving.service_curve import ProvenLoad

pytestmark = pytest.mark.timeout(60)
KEY = ModelKey.asr("en")


def test_the_most_overdue_owed_item_says_how_late_the_model_is() -> None:
    owed: Owed[str] = Owed()
    owed.add("asr", 1, deadline=10.0)
    owed.add("asr", 2, deadline=11.0)
    owed.add("mt", 3, deadline=5.0)
    assert owed.late("asr", now=9.0) == 0.0  # nothing due yet
    assert owed.late("asr", now=10.5) == pytest.approx(0.5)
    owed.settle("asr", 1)
    assert owed.late("asr", now=10.5) == 0.0  # the late one was answered; the other is not due
    assert owed.late("asr", now=12.0) == pytest.approx(1.0)
    assert owed.late("mt", now=12.0) == pytest.approx(7.0)  # each model its own
    owed.settle("asr", 2)
    owed.settle("asr", 2)  # settled twice (a timeout, then its cancel): nothing
    assert owed.late("asr", now=99.0) == 0.0 and owed.owed("asr") == 0


def test_a_wedged_item_is_forgotten_after_a_while() -> None:
    # its wait is bounded by the request timeout (300 s) and two retries: it must not shut the model for that long
    owed: Owed[str] = Owed()
    owed.add("asr", 1, deadline=0.0)
    assert owed.late("asr", now=20.0, forget_after=30.0) == pytest.approx(20.0)
    assert owed.late("asr", now=31.0, forget_after=30.0) == 0.0
    owed.settle("asr", 1)  # answered at last: nothing left to settle
    assert owed.owed("asr") == 0


def test_items_answered_out_of_order_do_not_pile_up() -> None:
    owed: Owed[str] = Owed()
    owed.add("asr", 0, deadline=0.0)  # one item that never settles, at the top of the heap
    for seq in range(1, 10_001):
        owed.add("asr", seq, deadline=float(seq))
        owed.settle("asr", seq)
    assert owed.owed("asr") == 1
    assert len(owed._heaps["asr"]) < 200  # compacted as it went, not 10,000 settled entries under the open one
    assert owed.late("asr", now=3.0) == pytest.approx(3.0)


@contextlib.asynccontextmanager
async def executor_on(runner: SerialRunner) -> AsyncIterator[Executor]:
    """The product's executor with ``runner`` as its ASR engine, closed at the end."""
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        yield executor
    finally:
        await executor.close()


async def test_a_model_owing_a_late_caption_refuses_the_next_stream_and_takes_it_once_caught_up() -> None:
    runner = SerialRunner(per_item=0.05)  # 20 items/s
    clip = AsrInput(np.zeros(1600, np.float32))
    async with executor_on(runner) as executor:
        for i in range(6):  # warm: its first items waited on nothing, and it has served some
            await asyncio.wait_for(executor.run(KEY, clip, CallContext(stream_id=f"w{i}")), 10)
        executor.admit(Demand("first", "interactive", {KEY: 0.1}))
        # whatever load it was seen to carry is a floor admission never refuses below: the late signal overrides it
        executor.scheduler.proven[KEY] = ProvenLoad(floor=1_000.0)
        # 40 captions at once, interactive (0.6 s of ASR each): served one every 50 ms, the last ones are late
        burst = asyncio.gather(*(executor.run(KEY, clip, CallContext(stream_id=f"b{i}", slo="interactive"))
                                 for i in range(40)))
        deadline = time.monotonic() + 10
        while executor.owed.late(KEY, executor.clock()) == 0.0:
            assert time.monotonic() < deadline, "no caption ever became late"
            await asyncio.sleep(0.02)
        with pytest.raises(Overloaded) as refused:
            executor.admit(Demand("second", "interactive", {KEY: 0.1}))
        assert refused.value.details["full"] == str(KEY) and refused.value.details["late_s"] > 0
        assert f"({KEY} is behind" in refused.value.message  # told apart from a curve's "is full"
        assert refused.value.retry_after and refused.value.retry_after > 0
        outs = await asyncio.wait_for(burst, 20)
        assert all(o.text == "1600 samples" for o in outs)  # the admitted work was served, late or not
        assert executor.owed.owed(KEY) == 0
        executor.admit(Demand("second", "interactive", {KEY: 0.1}))  # caught up: taken


async def test_a_caption_whose_clock_ran_out_upstream_is_not_held_against_the_model() -> None:
    # MT is asked after ASR has used some of the caption's time: what counts is the item's own time at the model
    runner = SerialRunner(per_item=0.01)
    clip = AsrInput(np.zeros(1600, np.float32))
    async with executor_on(runner) as executor:
        for i in range(4):
            await asyncio.wait_for(executor.run(KEY, clip, CallContext(stream_id=f"w{i}")), 10)
        runner.per_item = 0.2  # the next ones are still being served when admission asks
        old = executor.clock() - 5.0  # its words arrived 5 s ago: past any interactive deadline
        calls = asyncio.gather(*(executor.run(KEY, clip, CallContext(stream_id=f"o{i}", slo="interactive",
                                                                     start=old)) for i in range(2)))
        await asyncio.sleep(0.05)
        assert executor.owed.owed(KEY) > 0  # being served, within 0.6 s of their own
        executor.admit(Demand("s", "interactive", {KEY: 0.1}))
        await asyncio.wait_for(calls, 10)


async def test_captions_waiting_on_a_runners_build_do_not_refuse_streams() -> None:
    # its first items wait on the model's build (a GPU engine's MT runner is built at its first call): late, but
    # the runner is not behind; only items submitted once it has served one count
    runner = SerialRunner(per_item=0.01, build_s=1.0)
    clip = AsrInput(np.zeros(1600, np.float32))
    async with executor_on(runner) as executor:
        first = asyncio.gather(*(executor.run(KEY, clip, CallContext(stream_id=f"c{i}", slo="interactive"))
                                 for i in range(3)))
        await asyncio.sleep(0.8)  # past their 0.6 s, still waiting on the build
        assert executor.owed.owed(KEY) == 0
        executor.admit(Demand("s", "interactive", {KEY: 0.1}))
        await asyncio.wait_for(first, 20)


async def test_a_files_pieces_behind_the_captions_do_not_refuse_streams() -> None:
    # a file's piece waits behind every stream's captions by design (its class's 36 s of ASR): not a late caption
    runner = SerialRunner(per_item=0.01)
    clip = AsrInput(np.zeros(1600, np.float32))
    async with executor_on(runner) as executor:
        await asyncio.wait_for(executor.run(KEY, clip, CallContext(stream_id="w")), 10)
        runner.per_item = 0.2
        piece = asyncio.ensure_future(executor.run(KEY, clip, CallContext(stream_id="f", slo=FILE_CLASS)))
        caption = asyncio.ensure_future(executor.run(KEY, clip, CallContext(stream_id="c", slo="interactive")))
        await asyncio.sleep(0.05)
        assert executor.owed.owed(KEY) == 1  # the caption only
        await asyncio.wait_for(asyncio.gather(piece, caption), 10)
