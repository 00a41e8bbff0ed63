"""The model threads with and without chaos (serving/threads.py, serving/faults.py): a batch crosses the faults only
while one is set, and each kind of fault reaches the caller as a real broken backend would (no models: a runner
stands in)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from lingua_fusion.errors import InjectedFault, MalformedOutput, ModelTimeout
from lingua_fusion.serving import threads as threads_mod
from lingua_fusion.serving.faults import parse_fault
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrOutput, MtInput
from lingua_fusion.serving.threads import ModelThreads

KEY = ModelKey.mt("en", "es")
BATCH: list[object] = [MtInput("hello"), MtInput("good day")]


def echo(items: list[object]) -> Sequence[object]:
    return [f"<{it.text}>" for it in items if isinstance(it, MtInput)]


def model_threads(timeout_s: float = 5.0) -> ModelThreads:
    return ModelThreads(lambda key, payloads, warm: timeout_s)


async def test_without_faults_a_batch_does_not_cross_the_chaos_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(*_args: object) -> None:
        raise AssertionError("with_faults applied with no fault set")

    monkeypatch.setattr(threads_mod, "with_faults", no)
    mt = model_threads()
    try:
        assert await mt.start(KEY, echo, list(BATCH)) == ["<hello>", "<good day>"]
        assert KEY in mt.warm
    finally:
        mt.close()


async def test_an_error_fault_fails_the_batch_without_running_it() -> None:
    ran = threading.Event()

    def runner(items: list[object]) -> Sequence[object]:
        ran.set()
        return echo(items)

    mt = model_threads()
    mt.faults["mt/error"] = parse_fault({"model": "mt", "kind": "error"})
    try:
        with pytest.raises(InjectedFault):
            await mt.start(KEY, runner, list(BATCH))
        assert not ran.is_set()
        assert mt.faults["mt/error"].fired == 1
        heard = [AsrOutput("hi", 0.9)]
        assert await mt.start(ModelKey.asr("en"), lambda items: heard, [b"a"]) == heard  # an mt fault spares asr
    finally:
        mt.close()


async def test_a_delay_fault_starts_the_batch_late_and_holds_no_thread() -> None:
    started: list[float] = []

    def runner(items: list[object]) -> Sequence[object]:
        started.append(time.monotonic())
        return echo(items)

    mt = model_threads(timeout_s=0.2)  # the timeout counts from the launch, after the delay
    mt.faults["mt/delay"] = parse_fault({"model": "mt", "kind": "delay", "delay_s": 0.4})
    try:
        t0 = time.monotonic()
        delayed = mt.start(KEY, runner, list(BATCH))
        await asyncio.sleep(0.2)
        assert not mt._pools  # the batch waits on the loop: no thread is made or held for it meanwhile
        assert await delayed == ["<hello>", "<good day>"]
        assert started[0] - t0 >= 0.39
    finally:
        mt.close()


async def test_a_garbage_fault_is_caught_by_the_output_check() -> None:
    mt = model_threads()
    mt.faults["*/garbage"] = parse_fault({"kind": "garbage"})
    try:
        for _ in range(8):
            with pytest.raises(MalformedOutput):
                await mt.start(KEY, echo, list(BATCH))
        assert KEY not in mt.warm
    finally:
        mt.close()


async def test_a_hang_fault_times_out_and_counts_as_stuck_until_it_returns() -> None:
    mt = model_threads(timeout_s=0.2)
    mt.faults["mt/hang"] = parse_fault({"model": "mt", "kind": "hang", "delay_s": 0.6})
    try:
        with pytest.raises(ModelTimeout):
            await mt.start(KEY, echo, list(BATCH))
        assert mt.stuck() == {str(KEY): 1}
        mt.faults.clear()
        async with asyncio.timeout(5):
            while mt.stuck():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert await mt.start(KEY, echo, list(BATCH)) == ["<hello>", "<good day>"]
    finally:
        mt.close()
