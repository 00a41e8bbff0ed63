"""A GPU runner with ``gather_s`` (``models.engine_gather_ms``) lets new items that come while sequences decode wait a
moment to share one encoder batch, whose host cost is about the same for one item as for several: on an H100 a
start cost 2-5 ms of the runner's thread per item when each took one or two. The CPU runner with the tiny random
Whisper: the batches the encoder was called with."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from gpu_models import tiny_whisper_recipe

from lingua_fusion.serving.gpu.runner import GpuRunner
from lingua_fusion.serving.ports import AsrInput

pytestmark = pytest.mark.timeout(120)


def _runner(gather_s: float, gather_items: int = 3, when: list[float] | None = None) -> tuple[GpuRunner, list[int]]:
    """A runner whose encoder calls' sizes (and times, into ``when``) are recorded, and whose every step takes 20 ms
    (a long decode runs for about a second: 48 positions)."""
    recipe = tiny_whisper_recipe(tokens_per_s=40.0, max_tokens=64)
    sizes: list[int] = []
    encode = recipe.encode

    def recorded(payloads: list[AsrInput]) -> list[torch.Tensor]:
        sizes.append(len(payloads))
        if when is not None:
            when.append(time.monotonic())
        return encode(payloads)

    recipe.encode = recorded  # type: ignore[method-assign]
    runner = GpuRunner(recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu", gather_s=gather_s, gather_items=gather_items)
    step = runner.engine.step

    def slow_step() -> int:
        time.sleep(0.02)
        return step()

    runner.engine.step = slow_step  # type: ignore[method-assign]
    return runner, sizes


def _clip(seconds: float, seed: int) -> AsrInput:
    return AsrInput(np.random.default_rng(seed).normal(0, 0.1, int(16000 * seconds)).astype(np.float32))


def _while_one_decodes(runner: GpuRunner, clips: list[AsrInput]) -> list[str]:
    """A long decode first; once it steps, ``clips`` one submit at a time, 60 ms apart (three steps); every
    result."""
    long = runner.submit([_clip(2.0, 0)], [False])[0]
    deadline = time.monotonic() + 30
    while runner.engine.steps == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    futures = []
    for c in clips:
        futures.append(runner.submit([c], [False])[0])
        time.sleep(0.06)
    return [f.result(timeout=60).text for f in [long, *futures]]


def test_items_that_come_while_sequences_decode_share_one_encoder_batch() -> None:
    clips = [_clip(0.5, i + 1) for i in range(3)]
    runner, sizes = _runner(gather_s=10.0)
    try:
        gathered = _while_one_decodes(runner, clips)
    finally:
        runner.close()
    assert sizes == [1, 3]  # the long one alone, then the three together once the third came
    plain, plain_sizes = _runner(gather_s=0.0)
    try:
        each = _while_one_decodes(plain, clips)
    finally:
        plain.close()
    assert plain_sizes == [1, 1, 1, 1]  # without gathering, the runner's next turn starts what has come
    assert gathered == each  # the same transcripts either way


def test_a_lone_item_waits_no_longer_than_the_gather_time() -> None:
    started: list[float] = []
    runner, sizes = _runner(gather_s=0.2, gather_items=8, when=started)
    try:
        long = runner.submit([_clip(2.0, 0)], [False])[0]
        deadline = time.monotonic() + 30
        while runner.engine.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        t = time.monotonic()
        runner.submit([_clip(0.5, 1)], [False])[0].result(timeout=60)
        waited = started[-1] - t  # from its submit to its encoder batch
        assert not long.done()  # it came back while the long decode still ran: not held until the runner idled
        long.result(timeout=60)
    finally:
        runner.close()
    # held for the gather time, then started on the runner's next turn (after a step of 20 ms)
    assert sizes == [1, 1] and 0.2 <= waited < 0.2 + 0.15


def test_a_model_process_takes_its_switch_interval_from_the_settings() -> None:
    import sys

    from lingua_fusion.api.workers import switch_interval
    from lingua_fusion.config import Settings

    before = sys.getswitchinterval()
    try:
        assert switch_interval(Settings()) == before  # unset: Python's own, untouched
        assert switch_interval(Settings(models={"switch_interval_ms": 0.5})) == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
