"""A GPU runner's encoder memo (serving/gpu/memo.py): the same window read again (a commit after its partial)
reuses its encoder output; the window's full hash, which cost the H100's ASR runner thread 0.5-1.4 ms an item, is
taken for partials and for a commit only where a partial's prefilter matched; a window that only looks the same
(the same length and sampled samples) is never shared."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpu_models import tiny_whisper_recipe

from lingua_fusion.serving.gpu.memo import EncoderMemo, audio_prefilter
from lingua_fusion.serving.gpu.runner import GpuRunner
from lingua_fusion.serving.ports import AsrInput

pytestmark = pytest.mark.timeout(120)


class _Recipe:
    def key(self, payload: np.ndarray) -> bytes:
        return payload.tobytes()

    def prefilter(self, payload: np.ndarray) -> bytes:
        return audio_prefilter(payload)


def _window(seed: int, seconds: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(16000 * seconds)).astype(np.float32)


def test_a_commit_is_hashed_only_where_a_partial_of_its_prefilter_is_kept() -> None:
    memo = EncoderMemo(_Recipe(), size=2)
    a, b, c = _window(1), _window(2), _window(3)
    keys, filters = memo.keys([a], [True])  # a partial: hashed and kept
    assert keys == [a.tobytes()] and memo.hashed == 1 and memo.keep(a.tobytes(), 7, filters[0])
    keys, _ = memo.keys([b, a], [False, False])  # a commit of another window: not hashed; of a's: found
    assert keys == [None, a.tobytes()] and memo.hashed == 2 and memo.get(keys[1]) == 7
    assert not memo.keep(a.tobytes(), 8, filters[0])  # one entry a key
    for i, w in enumerate((b, c)):  # two more partials: a is the least recently used, and is forgotten
        memo.keep(w.tobytes(), 10 + i, audio_prefilter(w))
        if len(memo) > memo.size:
            assert memo.forget_oldest() == 7
    keys, _ = memo.keys([a], [False])
    assert keys == [None] and memo.hashed == 2  # a's prefilter went with it


def test_without_a_prefilter_every_item_is_hashed() -> None:
    class Plain:
        def key(self, payload: bytes) -> bytes:
            return payload

    memo = EncoderMemo(Plain(), size=4)
    keys, filters = memo.keys([b"x", b"y"], [False, True])
    assert keys == [b"x", b"y"] and filters == [None, None] and memo.hashed == 2


def test_a_window_that_only_looks_like_a_partials_is_encoded_for_itself() -> None:
    """The same length and the same 64 sampled samples, different audio between them: the commit must not be given
    the partial's encoder output (it would be captioned with the partial's words)."""
    partial = _window(4)
    twin = partial.copy()
    twin[1::2] = _window(5)[1::2]  # the prefilter samples every 500th, at even places: unchanged
    assert audio_prefilter(twin) == audio_prefilter(partial) and not np.array_equal(twin, partial)
    runner = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                       dtype=torch.float32, device="cpu", memo=4)
    try:
        runner.submit([AsrInput(partial)], [True])[0].result(timeout=60)
        looked_alike = runner.submit([AsrInput(twin)], [False])[0].result(timeout=60)
        same = runner.submit([AsrInput(partial)], [False])[0].result(timeout=60)
        fresh = runner.submit([AsrInput(_window(6))], [False])[0].result(timeout=60)
    finally:
        runner.close()
    alone = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                      dtype=torch.float32, device="cpu", memo=0)
    try:
        expected = alone.submit([AsrInput(twin)], [False])[0].result(timeout=60)
    finally:
        alone.close()
    assert looked_alike.text == expected.text
    assert runner.encoded == 3 and runner.reused == 1 and same.text  # the partial's own commit reused it
    assert runner.memo.hashed == 3 and fresh.text  # the partial, its look-alike, its commit; not the fresh commit


def test_an_item_that_fails_to_start_leaves_no_encoder_output_behind() -> None:
    """A batch of commits (no key: none follows a partial) whose second item's prompt raises: the batch fails, and
    every encoder output it added is given back, so the next windows still find room (they did not: two such
    batches filled the pool for good)."""
    def prompt(text: str | None) -> list[int]:
        if text == "boom":
            raise ValueError("a prompt that cannot be built")
        return [2]

    runner = GpuRunner(tiny_whisper_recipe(prompt=prompt), blocks=128, cross_blocks=32, block_size=8,
                       cross_block_size=16, dtype=torch.float32, device="cpu", memo=4)
    try:
        for k in range(3):
            batch = [AsrInput(_window(10 + 4 * k + j), prompt="boom" if j == 1 else None) for j in range(4)]
            for f in runner.submit(batch, [False] * 4):
                with pytest.raises(Exception):  # noqa: B017 (the batch fails as a whole: BackendError)
                    f.result(timeout=60)
        assert runner.engine.idle() and runner.engine.cross_pool.stats().used == 0
        assert runner.submit([AsrInput(_window(99))], [False])[0].result(timeout=60).text
    finally:
        runner.close()


def test_a_prefilter_shared_by_two_kept_partials_still_finds_the_older_one() -> None:
    memo = EncoderMemo(_Recipe(), size=4)
    a = _window(7)
    b = a.copy()
    b[1::2] = 0.0  # the same prefilter, other audio
    for entry, w in enumerate((a, b)):
        memo.keep(w.tobytes(), entry, audio_prefilter(w))
    memo.use(a.tobytes())  # b is now the least recently used
    assert memo.forget_oldest() == 1
    keys, _ = memo.keys([a], [False])  # a's commit is still looked up
    assert keys == [a.tobytes()] and memo.get(keys[0]) == 0
