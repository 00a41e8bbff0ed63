"""Whisper batches of one model key that run at once (``models.asr_parallel``, issue 12 on the CPU machine).

The executor gives such a key one worker per lane, each taking its own batch from the scheduler; the model threads
give it as many threads; admission counts its capacity once per lane; WhisperASR runs that many CTranslate2 workers.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from conftest import piper_wav

from lingua_fusion.config import LimitSettings, ModelSettings, ServerSettings, Settings
from lingua_fusion.errors import BackendError
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext, MtInput
from lingua_fusion.serving.scheduler import CostModel, Demand, Scheduler

KEY = ModelKey.asr("en")


class Lanes:
    """A fake Whisper runner that notes how many of its batches run at once. Each batch waits until ``hold``
    batches run together (or, with fewer lanes than that, until the test lets it go), so a lane too many would
    show up as one more batch running."""

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.active = 0
        self.peak = 0
        self.batches: list[int] = []
        self._lock = threading.Lock()
        self.together = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[AsrInput]) -> list[AsrOutput]:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.batches.append(len(items))
            if self.active >= self.hold:
                self.together.set()
        self.release.wait(30)
        with self._lock:
            self.active -= 1
        return [AsrOutput(f"clip {int(it.audio[0])}", 0.9) for it in items]


def settings(parallel: int, **server: Any) -> Settings:
    return Settings(models=ModelSettings(asr_parallel=parallel), server=ServerSettings(**server))


@pytest.mark.parametrize("lanes", [1, 2, 3])
async def test_a_keys_batches_overlap_up_to_its_lanes_and_never_more(lanes: int) -> None:
    """Twelve committed clips in batches of at most two: with N lanes, N batches run at once, never N + 1, and every
    clip gets its own answer."""
    runner = Lanes(hold=lanes)
    ex = Executor(None, settings(lanes), backends={"asr": lambda key: runner}, max_batch=2)  # type: ignore[arg-type]
    calls = [asyncio.create_task(ex.run(KEY, AsrInput(np.full(160, i, dtype=np.float32)), CallContext(f"s{i}")))
             for i in range(12)]
    assert await asyncio.to_thread(runner.together.wait, 30)  # N batches running at once
    await asyncio.sleep(0.2)  # a lane too many would start its batch now, with N still held
    peak_while_held = runner.peak
    runner.release.set()
    results = await asyncio.gather(*calls)
    await ex.close()
    assert peak_while_held == lanes
    assert runner.peak == lanes
    assert [r.text for r in results] == [f"clip {i}" for i in range(12)]
    assert sum(runner.batches) == 12 and max(runner.batches) <= 2
    # batches that ran alongside another lane are the overlapped cost samples admission reads (the first, cold
    # batch is no sample)
    overlapped = ex.scheduler.overlap_costs.get(KEY)
    assert (overlapped.observations if overlapped else 0) > 0 if lanes > 1 else overlapped is None


async def test_mt_keeps_one_lane_when_asr_has_two() -> None:
    """Apertium is not made parallel by ``asr_parallel``: eight MT items, one batch at a time."""
    runner = Lanes(hold=2)  # ``together``: two MT batches running at once

    def mt(items: list[MtInput]) -> list[str]:
        runner([AsrInput(np.zeros(1, dtype=np.float32)) for _ in items])
        return [it.text for it in items]

    ex = Executor(None, settings(2), backends={"mt": lambda key: mt}, max_batch=1)  # type: ignore[arg-type]
    key = ModelKey.mt("en", "es")
    calls = [asyncio.create_task(ex.run(key, MtInput(f"t{i}"), CallContext(f"s{i}"))) for i in range(8)]
    await asyncio.sleep(0.3)  # a second MT lane would have started its batch by now
    peak_while_held = runner.peak
    runner.release.set()
    out = await asyncio.gather(*calls)
    await ex.close()
    assert out == [f"t{i}" for i in range(8)]
    assert (peak_while_held, runner.peak, ex.lanes(key)) == (1, 1, 1)


async def test_two_stuck_lanes_count_as_two_hung_calls_then_the_model_fails_fast() -> None:
    """Both lanes wedged past their timeout: each caller gets a timeout, the model counts two stuck calls and fails
    the next batch at once; when the backend comes back, so does the model."""
    first = threading.Event()
    wedge = threading.Event()

    def runner(items: list[AsrInput]) -> list[AsrOutput]:
        if first.is_set():
            wedge.wait(30)
        first.set()
        return [AsrOutput("ok", 0.9) for _ in items]

    s = settings(2, model_timeout_s=0.3, model_timeout_factor=0.01)
    ex = Executor(None, s, backends={"asr": lambda key: runner}, max_batch=1)  # type: ignore[arg-type]
    ctx = CallContext("s0", tentative=True)  # tentative: not retried, so each call is one batch
    assert (await ex.run(KEY, AsrInput(np.zeros(160, dtype=np.float32)), ctx)).text == "ok"  # warm
    stuck = await asyncio.gather(*(ex.run(KEY, AsrInput(np.zeros(160, dtype=np.float32)),
                                          CallContext(f"s{i}", tentative=True)) for i in range(2)),
                                 return_exceptions=True)
    assert all(isinstance(e, BackendError) and e.code == "model_timeout" for e in stuck), stuck
    assert ex.threads.stuck() == {str(KEY): 2}
    with pytest.raises(BackendError, match="not answering"):
        await ex.run(KEY, AsrInput(np.zeros(160, dtype=np.float32)), CallContext("s3", tentative=True))
    wedge.set()
    for _ in range(100):  # the abandoned threads return
        if not ex.threads.stuck():
            break
        await asyncio.sleep(0.05)
    assert ex.threads.stuck() == {}
    assert (await ex.run(KEY, AsrInput(np.zeros(160, dtype=np.float32)), ctx)).text == "ok"
    await ex.close()


def test_admission_counts_lanes_at_the_cost_their_batches_have_while_overlapping() -> None:
    """Two lanes admit as one until batches that ran alongside another lane were seen; then twice the streams of one
    lane when overlapping costs nothing (free cores), and no more than one lane's when it doubles a batch's latency
    (the lanes share the cores other jobs leave)."""

    def admitted(lanes: int, overlapped: list[float]) -> int:
        sched = Scheduler(costs={"asr:tiny.en": CostModel(0.3, 0.05)})
        sched.lanes["asr:tiny.en"] = lanes
        for b, seconds in enumerate(overlapped):
            sched.observe("asr:tiny.en", 1 + b % 3, seconds * (0.3 + 0.05 * (1 + b % 3)) / 0.35, overlapped=True)
        n = 0
        while sched.admit(Demand(f"s{n}", "standard", {"asr:tiny.en": 0.4})):
            n += 1
        return n

    one = admitted(1, [])
    assert one >= 3
    assert admitted(2, []) == one  # not yet seen to overlap
    assert admitted(2, [0.35] * 3) == one  # too few overlapped batches
    assert 2 * one <= admitted(2, [0.35] * 10) <= 2 * one + 1  # overlapping batches as fast as lone ones
    # overlapping batches twice as slow: no more than one lane (smaller batches fit the stage budget, too)
    assert 1 <= admitted(2, [0.7] * 10) <= one


def test_asr_parallel_resolves_to_at_most_two_lanes_and_is_set_by_environment(monkeypatch: Any) -> None:
    assert ModelSettings().asr_lanes() == 1  # one batch at a time unless asked (the measured default)
    assert 1 <= ModelSettings(asr_parallel=0).asr_lanes() <= 2
    monkeypatch.setenv("LINGUAFUSION_MODELS__ASR_PARALLEL", "3")
    assert Settings().models.asr_lanes() == 3
    with pytest.raises(ValueError):
        ModelSettings(asr_parallel=-1)


# ---- real Whisper tiny.en ---------------------------------------------------------------------------------------

SENTENCES = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
             "Our new product will be available in three colours.", "The train to the airport leaves every hour."]


@pytest.fixture(scope="module")
def speech() -> list[np.ndarray]:
    from lingua_fusion.media.audio import decode_audio

    return [decode_audio(piper_wav(s), LimitSettings())[0] for s in SENTENCES]


async def _transcripts(parallel: int, speech: list[np.ndarray]) -> tuple[list[str], int, int]:
    """Every clip through the executor with ``parallel`` lanes, the clips one batch each, all at once."""
    from lingua_fusion.models.registry import Registry

    s = settings(parallel)
    ex = Executor(Registry(s), s, max_batch=1)
    try:
        outs = await asyncio.gather(*(ex.run(KEY, AsrInput(a), CallContext(f"s{i}")) for i, a in enumerate(speech)))
        whisper = ex.registry.asr("en")
        return [o.text for o in outs], whisper.workers, whisper.threads_per_worker
    finally:
        await ex.close()


@pytest.mark.slow
async def test_two_whisper_lanes_transcribe_concurrent_batches_as_one_lane_does(speech: list[np.ndarray]) -> None:
    one, workers1, _ = await _transcripts(1, speech)
    two, workers2, threads2 = await _transcripts(2, speech)
    assert (workers1, workers2, threads2) == (1, 2, 1)  # two CTranslate2 workers, the 2 threads split
    assert two == one
    assert "report before Friday" in one[1]
