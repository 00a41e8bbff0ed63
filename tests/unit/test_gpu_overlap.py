"""``models.step_overlap``: a GPU runner's turn that starts new items launches its decode step, does the items'
encoder batch while the step runs, then takes the step's tokens (DecodeEngine.launch / finish). The CPU runner with
the tiny random Whisper, the overlap forced on (it applies on CUDA alone: on the CPU a launch computes the step): the
order of the work, and the same transcripts as without it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from gpu_models import tiny_whisper_recipe

from lingua_fusion.serving.gpu.runner import GpuRunner
from lingua_fusion.serving.ports import AsrInput

pytestmark = pytest.mark.timeout(120)


def _runner(overlap: bool, log: list[str]) -> GpuRunner:
    recipe = tiny_whisper_recipe(tokens_per_s=40.0, max_tokens=64)
    encode = recipe.encode

    def logged(payloads: list[AsrInput]) -> list[torch.Tensor]:
        log.append(f"encode {len(payloads)}")
        return encode(payloads)

    recipe.encode = logged  # type: ignore[method-assign]
    runner = GpuRunner(recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu")
    assert not runner.overlap  # CUDA only, whatever was asked
    runner.overlap = overlap
    engine = runner.engine
    launch, finish, step = engine.launch, engine.finish, engine.step

    def slow_launch():  # type: ignore[no-untyped-def]
        time.sleep(0.01)
        out = launch()
        log.append("launch")
        return out

    def logged_finish(launched):  # type: ignore[no-untyped-def]
        log.append("finish")
        return finish(launched)

    def slow_step() -> int:
        time.sleep(0.01)
        log.append("step")
        return step()

    engine.launch, engine.finish, engine.step = slow_launch, logged_finish, slow_step  # type: ignore[method-assign]
    return runner


def _clip(seconds: float, seed: int) -> AsrInput:
    return AsrInput(np.random.default_rng(seed).normal(0, 0.1, int(16000 * seconds)).astype(np.float32))


def _transcripts(runner: GpuRunner) -> list[str]:
    """A long decode; once it steps, three more one at a time, 50 ms apart, started while it decodes."""
    long = runner.submit([_clip(2.0, 0)], [False])[0]
    deadline = time.monotonic() + 30
    while runner.engine.steps == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    futures = []
    for i in range(3):
        futures.append(runner.submit([_clip(0.5, i + 1)], [i == 1])[0])  # one of them tentative (a partial)
        time.sleep(0.05)
    return [f.result(timeout=60).text for f in [long, *futures]]


def _run(overlap: bool) -> tuple[list[str], list[str]]:
    """``_transcripts`` on a fresh runner: the transcripts and the runner's order of work."""
    log: list[str] = []
    runner = _runner(overlap, log)
    try:
        return _transcripts(runner), log
    finally:
        runner.close()


def test_new_items_start_while_the_step_runs_and_decode_as_they_would_have() -> None:
    overlapped, log = _run(True)
    starts = [i for i, e in enumerate(log) if e.startswith("encode")]
    assert len(starts) == 4
    for i in starts[1:]:  # each item that came while one decoded: between a launch and its finish
        assert log[i - 1] == "launch" and log[i + 1] == "finish"
    assert "step" in log  # turns with nothing to start step whole (a step is a launch and its finish)
    each, plain_log = _run(False)
    plain_starts = [i for i, e in enumerate(plain_log) if e.startswith("encode")]
    assert len(plain_starts) == 4 and all(plain_log[i - 1] != "launch" for i in plain_starts[1:])  # between steps
    assert overlapped == each


def test_a_launched_step_then_finished_is_a_step() -> None:
    """The engine's halves: the same tokens as whole steps, and an engine with nothing running launches nothing."""
    recipe = tiny_whisper_recipe(tokens_per_s=40.0, max_tokens=16)
    runner = GpuRunner(recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu")
    runner.close()
    engine = runner.engine
    assert engine.launch() is None
    memory = recipe.encode([_clip(1.0, 5)])[0]
    outs = []
    for halves in (False, True):
        cid = engine.add_memory(memory)
        assert cid is not None
        fut = engine.submit(recipe.prompt(_clip(1.0, 5)), cid, max_new=12, stop=recipe.stop)
        engine.release(cid)
        while not engine.idle():
            if halves:
                launched = engine.launch()
                assert launched is not None and launched.done is None  # on the CPU the tokens are ready
                engine.finish(launched)
            else:
                engine.step()
        outs.append(fut.result(timeout=10).tokens)
    assert outs[0] == outs[1] and len(outs[0]) > 0


def test_a_launch_alone_records_no_autograd_history() -> None:
    """The runner calls launch outside step (the overlap): the step's writes into the KV pool must not carry
    autograd history (a graph that grows with every step), and its outputs need no gradient."""
    recipe = tiny_whisper_recipe(tokens_per_s=40.0, max_tokens=16)
    runner = GpuRunner(recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu")
    runner.close()
    engine = runner.engine
    cid = engine.add_memory(recipe.encode([_clip(1.0, 6)])[0])
    assert cid is not None
    engine.submit(recipe.prompt(_clip(1.0, 6)), cid, max_new=4, stop=recipe.stop)
    engine.release(cid)
    for _ in range(3):
        launched = engine.launch()
        assert launched is not None
        assert not launched.best_lp.requires_grad
        engine.finish(launched)
    assert not engine.kv.k.requires_grad and engine.kv.k.grad_fn is None
