"""The GPU engine's core on the CPU (torch's CPU build, tiny models with random weights): paged attention equals
dense attention, continuous batching gives the tokens of one-at-a-time greedy decoding, preemption and recompute
give the same output, and the block pool never leaks."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from gpu_models import TinyWhisper, reference_greedy
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lingua_fusion.serving.gpu.blocks import BlockPool
from lingua_fusion.serving.gpu.decoder import DecodeEngine
from lingua_fusion.serving.gpu.models import WhisperDecoder
from lingua_fusion.serving.gpu.paged import Gather, PagedKV, dense_attention

STOP = frozenset({0})


def test_paged_attention_equals_dense_attention() -> None:
    torch.manual_seed(1)
    heads, dim, lengths = 4, 8, [5, 17, 1, 33]
    pool = BlockPool(num_blocks=20, block_size=4)
    kv = PagedKV(pool, layers=1, heads=heads, head_dim=dim, dtype=torch.float32, device="cpu")
    dense_k = torch.zeros(len(lengths), heads, max(lengths), dim)
    dense_v = torch.zeros_like(dense_k)
    order = list(range(len(lengths)))
    for seq in order:
        assert pool.allocate(seq, 0)
    # tokens arrive interleaved across sequences, so their blocks are not contiguous
    for pos in range(max(lengths)):
        for seq in order:
            if pos < lengths[seq]:
                k, v = torch.randn(1, heads, dim), torch.randn(1, heads, dim)
                kv.write(0, torch.tensor([pool.append(seq)]), k, v)
                dense_k[seq, :, pos], dense_v[seq, :, pos] = k[0], v[0]
    q = torch.randn(len(lengths), heads, 1, dim)
    paged = kv.attend(0, q, Gather.build(pool, order, lengths, torch.device("cpu")))
    assert torch.allclose(paged, dense_attention(q, dense_k, dense_v, lengths), atol=1e-5)


def _requests(n: int, seed: int) -> list[tuple[torch.Tensor, list[int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        memory = torch.randn(rng.randint(3, 40), 32)
        prompt = [rng.randint(1, 96) for _ in range(rng.randint(1, 6))]
        out.append((memory, prompt))
    return out


def _engine(model: TinyWhisper, blocks: int, max_batch: int = 64) -> DecodeEngine:
    return DecodeEngine(WhisperDecoder(model), blocks=blocks, block_size=4, cross_blocks=64, cross_block_size=8,
                        max_batch=max_batch)


@pytest.mark.parametrize("blocks", [512, 24])  # plenty; and so few that sequences are preempted and recomputed
def test_continuous_batching_gives_the_tokens_of_one_at_a_time_greedy(blocks: int) -> None:
    model = TinyWhisper()
    reqs = _requests(12, seed=blocks)
    expected = [reference_greedy(model, mem, prompt, 20, STOP) for mem, prompt in reqs]
    engine = _engine(model, blocks)
    futures = []
    for i, (mem, prompt) in enumerate(reqs):
        cid = engine.add_memory(mem)
        assert cid is not None
        futures.append(engine.submit(prompt, cid, max_new=20, stop=STOP, tentative=i % 3 == 0))
        engine.release(cid)  # the sequences hold their own references
        if i % 4 == 3:
            engine.step()  # sequences join while others are half way through
    engine.run()
    got = [f.result(timeout=0) for f in futures]
    assert [g.tokens for g in got] == expected
    if blocks == 24:
        assert sum(g.preempted for g in got) > 0, "the small pool should have forced preemption"
    stats = engine.stats()
    assert stats.self_blocks_used == 0 and stats.cross_blocks_used == 0  # everything given back


def test_a_cross_entry_is_shared_by_every_decode_of_its_window() -> None:
    model = TinyWhisper()
    mem, prompt = _requests(1, seed=3)[0]
    engine = _engine(model, 128)
    cid = engine.add_memory(mem)
    assert cid is not None
    used = engine.stats().cross_blocks_used
    a = engine.submit(prompt, cid, max_new=10, stop=STOP, tentative=True)  # a partial re-decode
    b = engine.submit(prompt, cid, max_new=10, stop=STOP)  # the commit of the same audio
    assert engine.stats().cross_blocks_used == used  # written once
    engine.run()
    assert a.result().tokens == b.result().tokens == reference_greedy(model, mem, prompt, 10, STOP)
    assert engine.stats().cross_blocks_used == used  # still held by the caller's reference
    engine.release(cid)
    assert engine.stats().cross_blocks_used == 0


def test_the_pool_running_short_preempts_tentative_work_first() -> None:
    model = TinyWhisper()
    engine = _engine(model, blocks=5, max_batch=2)  # 4 blocks of 4 past the scratch block: 16 slots for two
    mem = torch.randn(5, 32)
    cid = engine.add_memory(mem)
    assert cid is not None
    committed = engine.submit([1, 2], cid, max_new=12, stop=frozenset())
    tentative = engine.submit([3, 4], cid, max_new=12, stop=frozenset(), tentative=True)
    engine.run()
    assert committed.result().preempted == 0 and tentative.result().preempted >= 1
    assert committed.result().tokens == reference_greedy(model, mem, [1, 2], 12, frozenset())
    assert tentative.result().tokens == reference_greedy(model, mem, [3, 4], 12, frozenset())


def test_a_sequence_longer_than_the_whole_pool_fails_instead_of_spinning() -> None:
    engine = _engine(TinyWhisper(), blocks=3, max_batch=2)  # 2 usable blocks: 8 tokens at most
    cid = engine.add_memory(torch.randn(5, 32))
    assert cid is not None
    fut = engine.submit([1, 2], cid, max_new=20, stop=frozenset())
    engine.release(cid)
    engine.run(max_steps=100)
    with pytest.raises(Exception, match="does not fit"):
        fut.result(timeout=0)
    assert engine.stats().self_blocks_used == 0 and engine.stats().cross_blocks_used == 0


def test_a_full_cross_pool_is_a_return_value() -> None:
    engine = _engine(TinyWhisper(), 16)
    assert engine.add_memory(torch.randn(64 * 8 + 1, 32)) is None  # more frames than the whole pool
    assert engine.stats().cross_blocks_used == 0


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / append / free: blocks are never lost, never shared, never over-counted."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks=12, block_size=3)
        self.lengths: dict[int, int] = {}
        self.next_id = 0

    @rule(tokens=st.integers(0, 10))
    def allocate(self, tokens: int) -> None:
        fits = self.pool.blocks_for(tokens) <= self.pool.stats().free
        ok = self.pool.allocate(self.next_id, tokens)
        assert ok == fits
        if ok:
            self.lengths[self.next_id] = tokens
        self.next_id += 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        free_before = self.pool.stats().free
        slot = self.pool.append(seq)
        if slot is None:
            assert free_before == 0 and self.lengths[seq] % self.pool.block_size == 0
        else:
            self.lengths[seq] += 1
            assert slot == self.pool.slot(seq, self.lengths[seq] - 1)

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        self.pool.free(seq)
        del self.lengths[seq]

    @invariant()
    def no_block_lost_or_shared(self) -> None:
        tables = [self.pool.table(s) for s in self.lengths]
        owned = [b for t in tables for b in t]
        assert len(owned) == len(set(owned))
        stats = self.pool.stats()
        assert stats.used == len(owned) and stats.free + stats.used == self.pool.num_blocks
        assert stats.tokens == sum(self.lengths.values())
        for s, t in zip(self.lengths, tables, strict=True):
            assert len(t) == self.pool.blocks_for(self.lengths[s])


TestPool = PoolMachine.TestCase
TestPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("arch", ["whisper", "marian"])
def test_the_engine_decodes_hugging_face_models_as_they_decode_themselves(arch: str) -> None:
    from gpu_models import hf_greedy, hf_marian, hf_whisper

    from lingua_fusion.serving.gpu.models import HFWhisperDecoder, MarianDecoder

    model = hf_whisper() if arch == "whisper" else hf_marian()
    adapter = HFWhisperDecoder(model) if arch == "whisper" else MarianDecoder(model)
    engine = DecodeEngine(adapter, blocks=64, block_size=4, cross_blocks=32, cross_block_size=8)
    reqs = _requests(5, seed=7)
    futures = []
    for mem, prompt in reqs:
        cid = engine.add_memory(mem)
        assert cid is not None
        futures.append(engine.submit(prompt, cid, max_new=15, stop=frozenset({3})))
        engine.release(cid)
    engine.run()
    for (mem, prompt), fut in zip(reqs, futures, strict=True):
        assert fut.result().tokens == hf_greedy(model, mem, prompt, 15, frozenset({3}))


async def test_live_streams_through_the_executor_on_continuous_gpu_runners() -> None:
    """The real stream engine (session, VAD lane, policy, scheduler, executor) on the GPU runners, on the CPU."""
    import numpy as np
    from fakes import FakeOwner
    from gpu_models import hf_marian, hf_whisper

    from lingua_fusion.config import Settings
    from lingua_fusion.serving.executor import Executor
    from lingua_fusion.serving.gpu.models import HFWhisperDecoder, MarianDecoder
    from lingua_fusion.serving.gpu.recipes import Seq2SeqTextRecipe, WhisperRecipe, hf_whisper_encoder
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.gpu.vad import energy_vad
    from lingua_fusion.stream.protocol import StreamSpec
    from lingua_fusion.stream.session import StreamSession

    asr_model, mt_model = hf_whisper(), hf_marian()

    def mel(audio: torch.Tensor) -> torch.Tensor:  # any [n_mels, frames] at 100 frames/s will do for the engine
        frames = audio[: len(audio) // 160 * 160].view(-1, 160)
        return frames[:, :8].T.contiguous()

    words = lambda toks: " ".join(f"w{t}" for t in toks)  # noqa: E731
    asr = GpuRunner(WhisperRecipe(HFWhisperDecoder(asr_model), encode=hf_whisper_encoder(asr_model), mel=mel,
                                  prompt=lambda _p: [2], text=words, stop=frozenset({3}), device="cpu",
                                  dtype=torch.float32, tokens_per_s=3.0, max_tokens=20),
                    blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                    device="cpu", name="asr")
    mt = GpuRunner(Seq2SeqTextRecipe(mt_model, MarianDecoder(mt_model), tokenize=lambda s: [4 + len(w) % 90
                                                                                            for w in s.split()],
                                     detokenize=words, start=2, stop=frozenset({3}), pad=1, device="cpu",
                                     length_ratio=1.0, max_tokens=20),
                   blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                   device="cpu", name="mt")
    settings = Settings()
    executor = Executor(None, settings, backends={  # type: ignore[arg-type]
        "asr": lambda _k: asr, "mt": lambda _k: mt, "vad": lambda _k: energy_vad("cpu")})
    spec = StreamSpec(source_lang="en", targets=["es"], slo="standard", min_confidence=0.0)  # random weights
    s = StreamSession(spec, executor, FakeOwner(), settings)
    s.start()
    loud = (np.sin(np.arange(16000 * 2) / 3) * 8000).astype("<i2").tobytes()
    quiet = np.zeros(16000, dtype="<i2").tobytes()
    for i, pcm in enumerate([loud, quiet, loud, quiet]):
        await s.feed_audio(pcm, ts=float(i * 2))
    await s.end()
    events = []
    while not events or events[-1]["type"] != "closed":
        events.append((await asyncio.wait_for(s.events.get(), timeout=60)).to_wire())
    finals = [e for e in events if e["type"] == "final"]
    await executor.close()
    asr.close()
    mt.close()
    assert [f["seq"] for f in finals] == [1, 2], events
    for f in finals:
        assert f["source_text"].startswith("w") and f["translations"]["es"].startswith("w")
    assert asr.engine.stats().self_blocks_used == 0 and mt.engine.stats().self_blocks_used == 0


def test_the_runner_encodes_an_audio_window_once_for_its_partial_and_its_commit() -> None:
    import numpy as np
    from gpu_models import hf_whisper

    from lingua_fusion.serving.gpu.models import HFWhisperDecoder
    from lingua_fusion.serving.gpu.recipes import WhisperRecipe, hf_whisper_encoder
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    model = hf_whisper()
    recipe = WhisperRecipe(HFWhisperDecoder(model), encode=hf_whisper_encoder(model),
                           mel=lambda a: a[: len(a) // 160 * 160].view(-1, 160)[:, :8].T.contiguous(),
                           prompt=lambda _p: [2], text=lambda t: " ".join(map(str, t)), stop=frozenset({3}),
                           device="cpu", dtype=torch.float32, tokens_per_s=4.0)
    runner = GpuRunner(recipe, blocks=128, cross_blocks=32, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu", memo=4)
    clip = AsrInput(np.random.default_rng(0).normal(0, 0.1, 16000 * 2).astype(np.float32))
    try:
        partial = runner.submit([clip], [True])[0].result(timeout=60)
        commit = runner.submit([clip], [False])[0].result(timeout=60)
        other = runner.submit([AsrInput(clip.audio[:16000].copy())], [False])[0].result(timeout=60)
    finally:
        runner.close()
    assert partial == commit and runner.encoded == 2 and runner.reused == 1
    assert other.text and runner.room() == runner.max_pending  # every item accounted for
