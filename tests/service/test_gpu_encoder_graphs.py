"""serving/gpu/encoder_graphs.py: an encoder replayed per (batch bucket, shape) gives what the plain call gives.

On the CPU the object runs the encoder on its padded shared buffers at every call (no graph), so these tests check
the bucketing, the padding rows, the shared buffers and the copies out; bench/gpu_checks.py checks the graphs
themselves on the H200 (CI has no GPU, and a test skipped there fails the run).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from gpu_models import hf_marian, hf_whisper, tiny_whisper_recipe

from lingua_fusion.serving.gpu.encoder_graphs import EncoderGraphs, bucket
from lingua_fusion.serving.gpu.graphs import buckets_up_to
from lingua_fusion.serving.gpu.models import MarianDecoder
from lingua_fusion.serving.gpu.recipes import Seq2SeqTextRecipe, hf_whisper_encoder, marian_encoder
from lingua_fusion.serving.ports import MtInput

BATCHES = [1, 2, 4, 8]


def mels(n: int, frames: int, seed: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(n, 8, frames, generator=torch.Generator().manual_seed(seed)).to(device)


def test_bucket_is_the_smallest_that_holds_the_batch() -> None:
    assert [bucket(n, BATCHES) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert bucket(9, BATCHES) is None
    assert buckets_up_to(8, smallest=1) == BATCHES
    assert buckets_up_to(100, smallest=1) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert buckets_up_to(1, smallest=1) == [1]


def test_padded_buckets_give_each_row_what_the_plain_call_gives() -> None:
    encode = hf_whisper_encoder(hf_whisper())
    graphs = EncoderGraphs(encode, BATCHES, "cpu")
    with torch.inference_mode():
        for n, frames, seed in [(8, 300, 0), (3, 300, 1), (5, 100, 2), (1, 300, 3), (11, 200, 4)]:
            x = mels(n, frames, seed)  # 3 after 8: row 3 of bucket 4 still holds the first call's row 3
            assert torch.allclose(graphs(x), encode(x), atol=1e-5), (n, frames)
    # one graph per (bucket, shape): 8x300, 4x300, 8x100, 1x300; 11 rows are past the largest bucket: the plain call
    assert (graphs.captured, graphs.eager, graphs.replays) == (4, 1, 4)
    with torch.inference_mode():
        graphs(mels(4, 300, 5))
    assert graphs.captured == 4  # the same bucket and shape again: no new graph


def test_a_result_is_not_overwritten_by_the_next_call() -> None:
    encode = hf_whisper_encoder(hf_whisper())
    graphs = EncoderGraphs(encode, BATCHES, "cpu")
    with torch.inference_mode():
        a = graphs(mels(4, 200, 0))
        graphs(mels(4, 200, 1))  # same graph, same output buffer
        assert torch.allclose(a, encode(mels(4, 200, 0)), atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_marian_on_padded_graph_buckets_equals_hugging_face_per_sentence(attention: str) -> None:
    """The MT recipe with ``marian_encoder`` through EncoderGraphs (ids padded to 8 tokens, the batch to a bucket,
    the mask always passed, in the form the model's attention takes) gives each sentence the encoder output Hugging
    Face's encoder gives the batch."""
    model = hf_marian()
    model.config._attn_implementation = attention
    graphs = EncoderGraphs(marian_encoder(model), BATCHES, "cpu")

    def recipe(padded: EncoderGraphs | None) -> Seq2SeqTextRecipe:
        return Seq2SeqTextRecipe(model, MarianDecoder(model), tokenize=lambda s: [4 + len(w) % 90 for w in s.split()],
                                 detokenize=str, start=2, stop=frozenset({0}), pad=1, device="cpu",
                                 padded_encode=padded)

    plain, graphed = recipe(None), recipe(graphs)
    for texts in (["a bb ccc dddd eeeee", "ff g", "h"], ["one two three"] * 4, ["x " * 30, "y"]):
        items = [MtInput(t) for t in texts]
        for got, want in zip(graphed.encode(items), plain.encode(items), strict=True):
            assert got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-5)
    assert graphs.replays == 3 and graphs.captured == 2  # 3 and 4 rows, 8 wide: one graph (bucket 4); 2 x 32


def test_calls_come_from_one_thread() -> None:
    graphs = EncoderGraphs(hf_whisper_encoder(hf_whisper()), BATCHES, "cpu")
    with torch.inference_mode():
        graphs(mels(2, 100, 0))
    failed: list[BaseException] = []

    def other() -> None:
        try:
            with torch.inference_mode():
                graphs(mels(2, 100, 1))
        except RuntimeError as exc:
            failed.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=30)
    assert len(failed) == 1 and "one thread" in str(failed[0])


def test_the_servers_whisper_encoder_on_graph_buckets_equals_its_own_call() -> None:
    """The server's engine recipe (shipped tiny.en weights) with its encoder on EncoderGraphs (the mask always
    passed, the batch padded to a bucket) gives each window the encoder output the torch backend's own call gives."""
    from lingua_fusion.config import Settings
    from lingua_fusion.models.registry import Registry
    from lingua_fusion.serving.gpu.torch_whisper import TorchWhisperRecipe
    from lingua_fusion.serving.ports import AsrInput

    asr = Registry(Settings()).asr_torch("en")
    encoder = asr.model.encoder
    graphs = EncoderGraphs(lambda mel, frames: encoder(mel, frames, always_mask=True), BATCHES, "cpu")
    plain, graphed = TorchWhisperRecipe(asr, "en"), TorchWhisperRecipe(asr, "en", encoder=graphs)
    rng = np.random.default_rng(0)
    for seconds in ([1.5, 3.0, 5.0], [2.0, 2.0]):  # mixed window lengths (masked rows), then one length (no mask)
        items = [AsrInput(rng.normal(0, 0.1, int(s * 16000)).astype(np.float32)) for s in seconds]
        for got, want in zip(graphed.encode(items), plain.encode(items), strict=True):
            assert got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-4)
    assert graphs.replays == 2


def test_capture_ahead_allocates_the_shared_buffers_once_and_captures_nothing_later() -> None:
    """Captured ahead, largest first: every graph's buffers are views of the same storage; calls after it capture
    nothing, and a shape not captured ahead runs as it is (nothing is captured while serving)."""
    encode = hf_whisper_encoder(hf_whisper())
    graphs = EncoderGraphs(encode, BATCHES, "cpu", lazy=False)
    graphs.capture([[((8, w), torch.float32)] for w in (100, 300, 200)])
    assert graphs.captured == 3 * len(BATCHES)
    bases = {g.inputs[0].untyped_storage().data_ptr() for g in graphs._graphs.values()}
    assert len(bases) == 1
    with torch.inference_mode():
        for n, w in [(3, 200), (8, 100), (1, 300), (2, 400)]:
            x = mels(n, w, n)
            assert torch.allclose(graphs(x), encode(x), atol=1e-5)
    assert (graphs.captured, graphs.replays, graphs.eager) == (3 * len(BATCHES), 3, 1)


def test_a_runner_captures_its_encoder_graphs_on_its_own_thread_before_it_serves() -> None:
    """``GpuRunner(prepare=[graphs.capture_ahead])``: the graphs are captured by the runner's thread (the one that
    replays them, with its own cuBLAS handle on CUDA) before the constructor returns, and the clips then decode as
    they do through the plain encoder; a prepare step that fails makes the constructor raise it."""
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    plain = tiny_whisper_recipe()
    captured_on: list[str] = []
    graphs = EncoderGraphs(plain._encode, BATCHES, "cpu", ahead=[[((8, w), torch.float32)] for w in (100, 200)])

    def capture() -> None:
        captured_on.append(threading.current_thread().name)
        graphs.capture_ahead()

    graphed = tiny_whisper_recipe(encode=graphs)  # the same seed: the same weights as ``plain``
    sizes = {"blocks": 128, "cross_blocks": 32, "block_size": 8, "cross_block_size": 16, "dtype": torch.float32,
             "device": "cpu"}
    runner = GpuRunner(graphed, name="graphed", prepare=[capture], **sizes)
    assert captured_on == ["gpu-graphed"] and graphs.captured == 2 * len(BATCHES)  # done before it returned
    reference = GpuRunner(plain, name="plain", **sizes)
    rng = np.random.default_rng(3)
    clips = [AsrInput(rng.normal(0, 0.1, int(16000 * s)).astype(np.float32)) for s in (0.6, 1.4, 2.0)]
    try:
        got = [f.result(timeout=60) for f in runner.submit(clips, [False] * 3)]
        want = [f.result(timeout=60) for f in reference.submit(clips, [False] * 3)]
    finally:
        runner.close()
        reference.close()
    assert got == want and graphs.replays >= 1 and graphs.eager == 0

    def fail() -> None:
        raise RuntimeError("capture refused (the test's)")

    with pytest.raises(RuntimeError, match="capture refused"):
        GpuRunner(tiny_whisper_recipe(), name="failing", prepare=[fail], **sizes)
