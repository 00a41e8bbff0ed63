"""Admission by measured cost for a continuous runner (the GPU engine, ``models.engine = "continuous"``, issue 28).

Such a runner batches on its own, so there is no batch latency to fit: before, its model was counted at no cost
and every stream offered was admitted, then almost none was served within its SLO (12 streams offered on the CPU
engine under ``serve --workers 2``: 3 within; 24: none, p99 23 s). Now each item's time from hand-over to result is
fitted against the items in flight when it was handed over, and by Little's law the model serves n / latency(n)
items/s with n in flight: admission lets streams in up to that and refuses the rest.

The runner below is a stand-in that serves one item at a time at a known rate (as a CPU decoder does): what is under
test is the executor's measure and the admission it drives. The real engine runs through the same path in
tests/test_gpu_engine_server.py, and ``bench/overload.py`` loads a live server with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext
from lingua_fusion.serving.scheduler import SERVICE_MIN_IN_FLIGHT, CostModel, Demand, Scheduler

KEY = ModelKey.asr("en")
MODEL = str(KEY)


def fitted(c0: float, c1: float, up_to: int) -> Scheduler:
    """A scheduler whose continuous model was seen serving items with latency c0 + c1 * n, n from 1 to ``up_to``."""
    s = Scheduler()
    s.service[MODEL] = CostModel(0.2, 0.1)  # the prior a runner starts from
    for _ in range(5):
        for n in range(1, up_to + 1):
            s.observe_service(MODEL, n, c0 + c1 * n)
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
    # one item in flight seen: one size says nothing of the slope, so the prior's (0.1 s an item) stands, and at
    # most SERVICE_MIN_IN_FLIGHT are counted: 4 / 0.4 s
    cold = fitted(0.05, 0.0, up_to=1)
    assert cold.capacity(MODEL, "standard") == pytest.approx(SERVICE_MIN_IN_FLIGHT / 0.4, rel=0.05)
    # a flat latency up to 100 in flight (a GPU with room to spare): the fit alone would promise the engine's
    # largest batch at once; counted at most twice what it has held, it is 200 in flight, 200 / 0.05 s
    proven = fitted(0.05, 0.0, up_to=100)
    assert proven.capacity(MODEL, "standard") == pytest.approx(200 / 0.05, rel=0.05)


def test_a_tighter_class_is_counted_at_the_latency_its_budget_allows() -> None:
    s = fitted(0.05, 0.1, up_to=12)
    # interactive: 0.6 s for ASR, 0.3 s to serve: 2 in flight (0.25 s), 8 items/s; standard allows 9.4
    assert s.capacity(MODEL, "interactive") == pytest.approx(2 / 0.25, rel=0.05)
    assert s.capacity(MODEL, "interactive") < s.capacity(MODEL, "standard")


class Serial:
    """A ContinuousRunner that serves one item every ``per_item`` seconds on its own thread."""

    def __init__(self, per_item: float) -> None:
        self.per_item = per_item
        self._queue: deque[tuple[Any, Future[Any]]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def room(self) -> int:
        return 256

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        futures: list[Future[Any]] = [Future() for _ in payloads]
        with self._cv:
            self._queue.extend(zip(payloads, futures, strict=True))
            self._cv.notify()
        return futures

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait(timeout=0.5)
                if self._closed:
                    return
                payload, future = self._queue.popleft()
            time.sleep(self.per_item)
            future.set_result(AsrOutput(f"{len(payload.audio)} samples", 0.9))


async def test_the_executor_measures_a_continuous_runner_and_refuses_streams_beyond_it() -> None:
    runner = Serial(per_item=0.02)  # 50 items/s at most
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        clip = AsrInput(np.zeros(1600, np.float32))
        for burst in (1, 2, 4, 8, 16, 24):  # load as streams would bring it: more in flight each time
            outs = await asyncio.wait_for(asyncio.gather(*(
                executor.run(KEY, clip, CallContext(stream_id=f"b{burst}-{i}")) for i in range(burst))), 30)
            assert all(o.text == "1600 samples" for o in outs)
        capacity = executor.scheduler.capacity(MODEL, "standard")
        assert 10 < capacity <= 55, capacity  # about 50 items/s, less on a loaded machine, never more
        streams = 0
        with pytest.raises(Overloaded):
            while True:  # streams of 2.5 items/s: about 16 fit in 0.8 x 50
                executor.admit(Demand(f"stream-{streams}", "standard", {MODEL: 2.5}))
                streams += 1
                assert streams < 100, "admission never refused"
        assert 3 <= streams <= 17, streams
    finally:
        await executor.close()
