"""The GPU engine's core on the CPU (torch's CPU build, tiny models with random weights): paged attention equals
dense attention, continuous batching gives the tokens of one-at-a-time greedy decoding, preemption and recompute
give the same output, and the block pool never leaks."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
import torch
from gpu_models import TinyWhisper, reference_greedy, tiny_whisper_recipe
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
    from gpu_models import hf_marian

    from lingua_fusion.config import Settings
    from lingua_fusion.serving.executor import Executor
    from lingua_fusion.serving.gpu.models import MarianDecoder
    from lingua_fusion.serving.gpu.recipes import Seq2SeqTextRecipe
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.gpu.vad import energy_vad
    from lingua_fusion.stream.protocol import StreamSpec
    from lingua_fusion.stream.session import StreamSession

    words = lambda toks: " ".join(f"w{t}" for t in toks)  # noqa: E731
    asr_recipe, mt_model = tiny_whisper_recipe(text=words, tokens_per_s=3.0, max_tokens=20), hf_marian()
    asr = GpuRunner(asr_recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
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

    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    recipe = tiny_whisper_recipe()
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


def test_a_runner_asked_for_step_graphs_it_cannot_capture_says_so_and_decodes_eagerly(
        caplog: pytest.LogCaptureFixture) -> None:
    """The server asks every CUDA runner for the decode step's graphs (``models.step_graphs``); where the paged
    attention is not Triton's (no graph can replay it) the runner warns and decodes as it does without them,
    instead of failing its build and every stream of its language."""
    import numpy as np

    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    clip = AsrInput(np.random.default_rng(3).normal(0, 0.1, 16000 * 2).astype(np.float32))
    outs = []
    for graphs in (False, True):
        runner = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                           dtype=torch.float32, device="cpu", kernel="torch", graphs=graphs, name=f"asr-{graphs}")
        try:
            outs.append(runner.submit([clip], [False])[0].result(timeout=60))
        finally:
            runner.close()
        assert runner.engine.graphs is None
        assert runner.step_profile() == ()  # nothing timed: admission extrapolates it by its measured slope
    assert outs[0] == outs[1] and outs[0].text
    assert [r.getMessage() for r in caplog.records if "decode step" in r.getMessage()] == \
        ["asr-True: no CUDA graphs of the decode step (they need the Triton paged attention, not 'torch'); it steps "
         "eagerly"]


def test_a_runner_with_step_graphs_times_them_for_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once its step's graphs are captured, the runner times each (StepGraphs.profile, on its own thread) and
    reports them (``step_profile``: admission's shape of it, serving/service_curve.py)."""
    from lingua_fusion.serving.gpu.decoder import DecodeEngine
    from lingua_fusion.serving.gpu.runner import GpuRunner

    class Timed:
        def __init__(self) -> None:
            self.on = threading.current_thread().name

        def profile(self) -> tuple[tuple[int, float], ...]:
            assert threading.current_thread().name == self.on  # where they were captured: the runner's thread
            return ((8, 0.0012), (16, 0.0013))

        def fits(self, n: int) -> bool:
            return False  # every step eager

    monkeypatch.setattr(DecodeEngine, "use_graphs", lambda engine, buckets: setattr(engine, "graphs", Timed()))
    runner = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                       dtype=torch.float32, device="cpu", kernel="torch", graphs=True, name="asr")
    try:
        assert runner.step_profile() == ((8, 0.0012), (16, 0.0013))
        assert runner.engine.graphs is not None and runner.engine.graphs.on == "gpu-asr"  # type: ignore[attr-defined]
    finally:
        runner.close()


def test_a_step_graph_capture_that_fails_part_way_leaves_an_eager_runner(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A capture that raises after some buckets were captured (out of GPU memory, a driver that refuses): the
    runner drops what was captured, warns, and decodes as it does without graphs."""
    import numpy as np

    from lingua_fusion.serving.gpu.decoder import DecodeEngine
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    def half_captured(engine: DecodeEngine, buckets: list[int]) -> None:
        engine.graphs = object()  # type: ignore[assignment]  # some buckets captured, then:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(DecodeEngine, "use_graphs", half_captured)
    clip = AsrInput(np.random.default_rng(3).normal(0, 0.1, 16000 * 2).astype(np.float32))
    plain = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                      dtype=torch.float32, device="cpu", kernel="torch")
    try:
        want = plain.submit([clip], [False])[0].result(timeout=60)
    finally:
        plain.close()
    runner = GpuRunner(tiny_whisper_recipe(), blocks=128, cross_blocks=32, block_size=8, cross_block_size=16,
                       dtype=torch.float32, device="cpu", kernel="torch", graphs=True, name="asr")
    try:
        assert runner.engine.graphs is None
        assert runner.submit([clip], [False])[0].result(timeout=60) == want
    finally:
        runner.close()
    assert any("CUDA graphs of the decode step failed (RuntimeError: CUDA out of memory); it steps eagerly"
               in r.getMessage() for r in caplog.records)


def test_a_burst_of_new_work_is_encoded_between_steps_of_what_runs() -> None:
    """Six clips arrive at once, two per encoder batch: the running decodes step between the batches (not after
    all six are encoded), and every clip decodes as it does alone."""
    import numpy as np

    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    recipe = tiny_whisper_recipe()
    steps_at_encode: list[int] = []
    encode = recipe.encode
    recipe.encode = lambda payloads: steps_at_encode.append(runner.engine.steps) or encode(payloads)
    runner = GpuRunner(recipe, blocks=256, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu", encode_batch=2)
    rng = np.random.default_rng(5)
    clips = [AsrInput(rng.normal(0, 0.1, 16000 * 2 + 800 * i).astype(np.float32)) for i in range(6)]
    try:
        together = [f.result(timeout=60) for f in runner.submit(clips, [False] * 6)]
        alone = [runner.submit([c], [False])[0].result(timeout=60) for c in clips]
    finally:
        runner.close()
    burst = steps_at_encode[:3]
    assert len(burst) == 3 and burst[0] < burst[1] < burst[2], steps_at_encode
    assert [o.text for o in together] == [o.text for o in alone] and runner.load.started_items == 12
    # (a committed window no partial read is encoded again, not taken from the memo (serving/gpu/memo.py), so the
    # encoder's batch of six against its batch of one differs in the last bits of the matrix sums)
    assert [o.confidence for o in together] == pytest.approx([o.confidence for o in alone], rel=1e-4)


def test_work_still_queued_when_the_runner_closes_fails_instead_of_hanging() -> None:
    import concurrent.futures

    import numpy as np

    from lingua_fusion.errors import BackendError
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    runner = GpuRunner(tiny_whisper_recipe(), blocks=256, cross_blocks=64, block_size=8, cross_block_size=16,
                       dtype=torch.float32, device="cpu", encode_batch=1)
    clips = [AsrInput(np.full(16000 + i, 0.01 * (i + 1), dtype=np.float32)) for i in range(40)]
    futures = runner.submit(clips, [False] * len(clips))
    runner.close()
    done, late = concurrent.futures.wait(futures, timeout=30)
    assert not late
    failed = [f for f in done if f.exception() is not None]
    assert failed and all(isinstance(f.exception(), BackendError) for f in failed)


def test_a_batch_of_clips_is_encoded_as_each_clip_alone_with_its_log_mel_in_one_call() -> None:
    """The benchmark's recipe on the H200 takes every clip's log-mel in one call (LogMel.ragged): the encoder
    outputs are those of the clip-by-clip path, clips of different lengths in one batch."""
    import numpy as np
    from gpu_models import hf_whisper

    from lingua_fusion.models.whisper_torch import LogMel
    from lingua_fusion.serving.gpu.models import HFWhisperDecoder
    from lingua_fusion.serving.gpu.recipes import WhisperRecipe, hf_whisper_encoder
    from lingua_fusion.serving.ports import AsrInput

    model, logmel = hf_whisper(n_mels=80), LogMel(80)

    def recipe(**mel: Any) -> WhisperRecipe:
        return WhisperRecipe(HFWhisperDecoder(model), encode=hf_whisper_encoder(model), prompt=lambda _p: [2],
                             text=str, stop=frozenset({3}), device="cpu", dtype=torch.float32, **mel)

    rng = np.random.default_rng(4)
    clips = [AsrInput(rng.normal(0, 0.1, n).astype(np.float32)) for n in (16000, 8123, 40000, 480, 23999)]
    one = lambda a: logmel(a[None])[0]  # noqa: E731
    alone = recipe(mel=one).encode(clips)
    batched = recipe(mel=one, mels=logmel.ragged).encode(clips)
    assert [t.shape for t in batched] == [t.shape for t in alone]
    for a, b in zip(alone, batched, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_a_full_cross_pool_fails_an_item_as_a_retryable_backend_error_and_the_runner_goes_on() -> None:
    """Pool exhaustion is a BackendError (the executor retries committed work; a partial is dropped), never an
    Overloaded that a stream's job would not expect."""
    import numpy as np

    from lingua_fusion.errors import BackendError, CapacityExhausted
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    recipe = tiny_whisper_recipe()
    # 3 cross blocks of 16 frames past the scratch one: one 2 s clip (100 frames after the encoder) cannot fit
    runner = GpuRunner(recipe, blocks=128, cross_blocks=4, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu", memo=0)
    rng = np.random.default_rng(1)
    try:
        big = runner.submit([AsrInput(rng.normal(0, 0.1, 16000 * 2).astype(np.float32))], [False])[0]
        with pytest.raises(CapacityExhausted) as full:
            big.result(timeout=60)
        assert isinstance(full.value, BackendError) and full.value.code == "engine_full"
        small = runner.submit([AsrInput(rng.normal(0, 0.1, 8000).astype(np.float32))], [True])[0].result(timeout=60)
    finally:
        runner.close()
    assert small.text and runner.room() == runner.max_pending


# ---- prefix reuse where exact: the same audio window, a prompt that starts the same way ---------------------------
GLOSSARY = [50, 7, 31, 31, 8, 62, 19, 44, 5, 90, 23]  # <|startofprev|> terms ... <|startoftranscript|>: 11 tokens


def _prefixed_requests(seed: int) -> list[tuple[int, list[int], bool]]:
    """(window, prompt, tentative) in submission order: every window decoded three times (two partials and the
    commit) with the glossary prompt, some with the previous utterance after it, mixed with prompt-less decodes."""
    rng = random.Random(seed)
    out = []
    for window in range(8):
        context = [rng.randint(1, 96) for _ in range(rng.randint(0, 6))] if window % 2 else []
        for tentative in (True, True, False):
            out.append((window, GLOSSARY + context if window % 4 != 3 else [2], tentative))
    return out


def _decode_windows(engine: DecodeEngine, memories: list[torch.Tensor], reqs: list[tuple[int, list[int], bool]],
                    max_new: int) -> list[list[int]]:
    cids = [engine.add_memory(m) for m in memories]  # held by the caller (the runner's memo) throughout
    futures = []
    for i, (window, prompt, tentative) in enumerate(reqs):
        cid = cids[window]
        assert cid is not None
        futures.append(engine.submit(prompt, cid, max_new=max_new, stop=STOP, tentative=tentative))
        for _ in range(i % 5):
            engine.step()  # later decodes of a window join while earlier ones are at every point of the prompt
    engine.run()
    for cid in cids:
        assert cid is not None
        engine.release(cid)
    return [f.result(timeout=0).tokens for f in futures]


@pytest.mark.parametrize("blocks", [512, 20])  # plenty; and so few that sequences sharing a prefix are preempted
def test_prefix_reuse_gives_the_tokens_of_decoding_without_it(blocks: int) -> None:
    model = TinyWhisper()
    torch.manual_seed(blocks)
    memories = [4 * torch.randn(random.Random(w).randint(3, 40), 32) for w in range(8)]  # loud: audio matters
    reqs = _prefixed_requests(seed=blocks)
    plain = DecodeEngine(WhisperDecoder(model), blocks=blocks, block_size=4, cross_blocks=64, cross_block_size=8,
                         prefix_cache=False)
    shared = _engine(model, blocks)
    expected = _decode_windows(plain, memories, reqs, 16)
    got = _decode_windows(shared, memories, reqs, 16)
    assert got == expected
    assert got == [reference_greedy(model, memories[w], p, 16, STOP) for w, p, _ in reqs]
    s, p = shared.stats(), plain.stats()
    assert s.prefix_hits > 0 and s.prefix_tokens > 0 and p.prefix_tokens == 0
    if not (s.preemptions or p.preemptions):  # (a preempted sequence recomputes: its tokens count twice)
        assert s.tokens == p.tokens - s.prefix_tokens  # each reused prompt token is not fed
    if blocks == 20:
        assert s.preemptions > 0, "the small pool should have forced preemption"
    for st_ in (s, p):  # everything given back, nothing left cached once the windows are released
        assert st_.self_blocks_used == 0 and st_.self_blocks_cached == 0 and st_.cross_blocks_used == 0


@pytest.mark.parametrize("n", [2, 5, 16])
def test_n_sequences_sharing_a_prefix_hold_its_full_blocks_once(n: int) -> None:
    model = TinyWhisper()
    engine = _engine(model, 256)  # block size 4
    mem = torch.randn(20, 32)
    cid = engine.add_memory(mem)
    assert cid is not None
    prompt = GLOSSARY + [11, 12]  # 13 tokens: 3 full blocks are shareable, the 13th token is fed by each
    first = engine.submit(prompt, cid, max_new=30, stop=frozenset())
    for _ in range(len(prompt)):
        engine.step()  # the first sequence has read its prompt and published 3 blocks
    assert engine.stats().self_blocks_used == 4
    rest = [engine.submit(prompt, cid, max_new=30, stop=frozenset()) for _ in range(n - 1)]
    engine.step()  # each later one takes the 3 blocks and feeds token 13 into a block of its own
    stats = engine.stats()
    assert stats.self_blocks_used == 3 + n  # not 4 * n
    assert stats.self_blocks_shared == (3 if n > 1 else 0)
    assert stats.prefix_hits == n - 1 and stats.prefix_tokens == 12 * (n - 1)
    tables = [engine.pool.table(s.id) for s in engine.running]
    assert all(t[:3] == tables[0][:3] for t in tables) and len({t[3] for t in tables}) == n
    engine.run()
    expected = reference_greedy(model, mem, prompt, 30, frozenset())
    assert [f.result().tokens for f in [first, *rest]] == [expected] * n
    stats = engine.stats()
    assert stats.self_blocks_used == 0 and stats.self_blocks_cached == 3  # cached while the window lives
    late = engine.submit(prompt, cid, max_new=3, stop=frozenset())  # the last user gone: still reusable
    engine.run()
    assert late.result().tokens == expected[:3] and engine.stats().prefix_hits == n
    engine.release(cid)
    assert engine.stats().self_blocks_cached == 0 and engine.stats().self_blocks_used == 0


@pytest.mark.parametrize("lag", [0, 2, 5])
def test_a_decode_that_follows_another_of_its_window_takes_its_blocks_as_they_fill(lag: int) -> None:
    """The commit submitted ``lag`` steps after the partial of the same window: it sits out until each block of the
    partial's prompt is full and takes it, so it feeds only the prompt's last token and whatever the partial had
    not written when the commit arrived past a block boundary."""
    model = TinyWhisper()
    engine = _engine(model, 128)  # block size 4; the glossary's 11 tokens: blocks 0 and 1 are shareable
    mem = torch.randn(12, 32)
    cid = engine.add_memory(mem)
    assert cid is not None
    partial = engine.submit(GLOSSARY, cid, max_new=6, stop=frozenset(), tentative=True)
    for _ in range(lag):
        engine.step()
    commit = engine.submit(GLOSSARY, cid, max_new=6, stop=frozenset())
    engine.run()
    expected = reference_greedy(model, mem, GLOSSARY, 6, frozenset())
    assert partial.result().tokens == commit.result().tokens == expected
    stats = engine.stats()
    assert stats.prefix_tokens == 8 and stats.tokens == 2 * (len(GLOSSARY) + 5) - 8
    # it sits out while the other writes a block it needs: both blocks (lag 0), the rest of block 0 and block 1
    # (lag 2), the rest of block 1 (lag 5: block 0 is written already); it never finishes later than alone
    assert stats.prefix_waits == {0: 8, 2: 6, 5: 3}[lag]
    assert stats.steps <= lag + len(GLOSSARY) + 5  # the steps the commit alone takes once it arrives
    engine.release(cid)
    assert engine.stats().self_blocks_used == 0 and engine.stats().self_blocks_cached == 0


def test_a_prompt_over_different_audio_is_not_shared() -> None:
    """Past the first layer a prompt position's keys/values depend on the audio (cross-attention), so the same
    prompt over another window is another cache: sharing it would change the output."""
    model = TinyWhisper()
    engine = _engine(model, 128)
    mems = [torch.randn(9, 32), torch.randn(9, 32)]
    cids = [engine.add_memory(m) for m in mems]
    blocks = []
    for cid, mem in zip(cids, mems, strict=True):
        assert cid is not None
        fut = engine.submit(GLOSSARY, cid, max_new=5, stop=STOP)
        engine.run()
        assert fut.result().tokens == reference_greedy(model, mem, GLOSSARY, 5, STOP)
        blocks.append(engine.pool.cached([(cid, tuple(GLOSSARY[:4]))]))
    assert engine.stats().prefix_hits == 0 and engine.stats().self_blocks_cached == 4  # 2 full blocks each
    (a,), (b,) = blocks
    rows_a, rows_b = slice(a * 4, a * 4 + 4), slice(b * 4, b * 4 + 4)
    assert torch.equal(engine.kv.k[0, rows_a], engine.kv.k[0, rows_b])  # layer 0: tokens and positions only
    assert not torch.allclose(engine.kv.k[1, rows_a], engine.kv.k[1, rows_b])  # layer 1: the audio too


def test_unused_prefix_blocks_are_handed_out_again_least_recently_used_first() -> None:
    pool = BlockPool(num_blocks=6, block_size=2, reserved=1)  # 5 usable blocks
    for seq, key in ((1, "a"), (2, "b")):
        assert pool.allocate(seq, 4)  # two full blocks each
        assert pool.publish(seq, 0, "w", key + "0") and pool.publish(seq, 1, "w", key + "1")
    a, b = pool.table(1), pool.table(2)
    pool.free(1)
    pool.free(2)  # the last users end: the four blocks stay cached, counted free
    assert pool.stats().used == 0 and pool.stats().cached == 4 and pool.cached(["a0", "a1"]) == a
    assert pool.allocate(3, 2)  # the plain free block goes first
    assert pool.stats().cached == 4
    assert pool.append(3) is not None and pool.append(3) is not None  # a second block: a cached one goes
    assert pool.cached(["a0", "a1"]) == a[:1] and pool.cached(["b0", "b1"]) == b  # a's tail, the oldest
    assert pool.allocate(4, 4)
    assert pool.cached(["a0"]) == [] and pool.cached(["b0", "b1"]) == b[:1]
    assert pool.stats().cached == 1 and pool.stats().free == 1
    pool.drop_group("w")  # the window died: its cached blocks are plain free blocks again
    assert pool.stats().cached == 0 and pool.stats().free == 1 and pool.cached(["b0"]) == []


class SharedPoolMachine(RuleBasedStateMachine):
    """Sequences that start from published prefix blocks, grow, publish, are preempted or end, and windows that
    die: every block is held by exactly the tables that list it, a shared block is full in every holder, a
    published key names the prompt prefix of every holder, and nothing leaks (used + free = all, cached counted
    free)."""

    PROMPTS = ([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [5, 6, 7, 8, 9, 10, 20, 21, 22], [30, 31, 32, 33])

    def __init__(self) -> None:
        super().__init__()
        self.bs = 3
        self.pool = BlockPool(num_blocks=8, block_size=self.bs, reserved=1)  # small: cached blocks get reused
        self.seqs: dict[int, tuple[int, list[int]]] = {}  # seq -> (window, prompt)
        self.lengths: dict[int, int] = {}
        self.keys: set[tuple[int, tuple[int, ...]]] = set()  # every key ever published (some evicted since)
        self.next_id = 0

    def _key(self, window: int, prompt: list[int], blocks: int) -> tuple[int, tuple[int, ...]]:
        return window, tuple(prompt[: blocks * self.bs])

    @rule(window=st.integers(0, 1), which=st.integers(0, 2), tokens=st.sampled_from([0, 0, 1, 3, 4]))
    def start(self, window: int, which: int, tokens: int) -> None:
        """A sequence starts (new, or preempted and started again) with ``tokens`` of its own."""
        fits = self.pool.blocks_for(tokens) <= self.pool.stats().free
        ok = self.pool.allocate(self.next_id, tokens)
        assert ok == fits
        if ok:
            self.seqs[self.next_id], self.lengths[self.next_id] = (window, self.PROMPTS[which]), tokens
        self.next_id += 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def catch_up(self, data: st.DataObject) -> None:
        """At a block boundary a sequence takes what is cached of its prompt's next full blocks."""
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        window, prompt = self.seqs[seq]
        n, table = self.lengths[seq], self.pool.table(seq)
        if n != len(table) * self.bs:
            with pytest.raises(ValueError):
                self.pool.extend(seq, self.pool.cached([self._key(window, prompt, n // self.bs + 1)]) or [0])
            return
        keys = [self._key(window, prompt, j) for j in range(n // self.bs + 1, len(prompt) // self.bs + 1)]
        shared = self.pool.cached(keys)
        free_before, before = self.pool.stats().free, list(table)
        idle = sum(1 for b in shared if self.pool.refs(b) == 0)
        self.pool.extend(seq, shared)
        assert self.pool.table(seq) == before + shared
        assert self.pool.stats().free == free_before - idle  # a cached block in use again stops being free
        self.lengths[seq] = n + len(shared) * self.bs

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        free_before = self.pool.stats().free
        slot = self.pool.append(seq)
        if slot is None:
            assert free_before == 0 and self.lengths[seq] % self.bs == 0
        else:
            self.lengths[seq] += 1
            assert self.pool.refs(slot // self.bs) == 1  # a token is only ever written to a private block

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def another_decode_of_the_window(self, data: st.DataObject) -> None:
        """A decode of a live sequence's window and prompt starts and takes the blocks published so far."""
        window, prompt = self.seqs[data.draw(st.sampled_from(sorted(self.lengths)))]
        assert self.pool.allocate(self.next_id, 0)
        shared = self.pool.cached(self._key(window, prompt, j) for j in range(1, len(prompt) // self.bs + 1))
        self.pool.extend(self.next_id, shared)
        self.seqs[self.next_id], self.lengths[self.next_id] = (window, prompt), len(shared) * self.bs
        self.next_id += 1

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def feed_a_block(self, data: st.DataObject) -> None:
        """As the engine does: tokens up to the end of a block, which is published if it holds prompt only."""
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        window, prompt = self.seqs[seq]
        while True:
            if self.pool.append(seq) is None:
                return
            self.lengths[seq] += 1
            if self.lengths[seq] % self.bs == 0:
                break
        if self.lengths[seq] <= len(prompt):
            index = self.lengths[seq] // self.bs - 1
            if self.pool.publish(seq, index, window, self._key(window, prompt, index + 1)):
                self.keys.add(self._key(window, prompt, index + 1))

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        window, prompt = self.seqs[seq]
        full = min(self.lengths[seq], len(prompt)) // self.bs
        if full:
            index = data.draw(st.integers(0, full - 1))
            key = self._key(window, prompt, index + 1)
            if self.pool.publish(seq, index, window, key):
                self.keys.add(key)

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """A sequence ends or is preempted, shared prefix or not (the last user's end leaves the blocks cached)."""
        seq = data.draw(st.sampled_from(sorted(self.lengths)))
        self.pool.free(seq)
        del self.lengths[seq], self.seqs[seq]

    @rule(window=st.integers(0, 2))
    def window_dies(self, window: int) -> None:
        for seq in [s for s, (w, _) in self.seqs.items() if w == window]:  # its sequences went first (they hold it)
            self.pool.free(seq)
            del self.lengths[seq], self.seqs[seq]
        self.pool.drop_group(window)
        assert not any(self.pool.cached([k]) for k in self.keys if k[0] == window)

    @invariant()
    def every_block_accounted_for(self) -> None:
        holders: dict[int, list[tuple[int, int]]] = {}
        for seq, table in ((s, self.pool.table(s)) for s in self.lengths):
            assert len(table) == self.pool.blocks_for(self.lengths[seq])
            for i, b in enumerate(table):
                holders.setdefault(b, []).append((seq, i))
        live = {k: self.pool.cached([k])[0] for k in self.keys if self.pool.cached([k])}
        assert len(set(live.values())) == len(live)  # a block under one key at most
        stats = self.pool.stats()
        assert stats.used == len(holders) and stats.free + stats.used == self.pool.num_blocks - 1
        assert stats.cached == sum(1 for b in live.values() if b not in holders)
        assert stats.shared == sum(1 for h in holders.values() if len(h) > 1)
        slots = {self.pool.slot(s, p) for s in self.lengths for p in range(self.lengths[s])}
        assert stats.tokens == len(slots) and 0 not in {b for b in holders}  # the reserved block is never used
        for b, hs in holders.items():
            assert self.pool.refs(b) == len(hs)
            if len(hs) > 1:
                assert all((i + 1) * self.bs <= self.lengths[s] for s, i in hs)  # shared blocks are full
        for key, b in live.items():  # exact: a published key is the prompt prefix of every holder of its block
            for s, i in holders.get(b, []):
                window, prompt = self.seqs[s]
                assert key == self._key(window, prompt, i + 1)


TestSharedPool = SharedPoolMachine.TestCase
TestSharedPool.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


def test_a_full_cross_attention_pool_holds_work_back_instead_of_failing_it() -> None:
    """More distinct audio windows at once than the cross-attention pool holds: the ones that do not fit wait
    (still pending, so the executor hands no more) until running sequences finish and free entries, then start;
    every item gets the result a roomy runner gives. Before, they failed ("the pool is full") and a committed
    caption was lost after the executor's retries. A window larger than the whole pool still fails at once."""
    import numpy as np

    from lingua_fusion.errors import CapacityExhausted
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    rng = np.random.default_rng(1)
    clips = [AsrInput(rng.normal(0, 0.1, 16000 * 2).astype(np.float32)) for _ in range(10)]
    sizes = {"blocks": 256, "block_size": 8, "cross_block_size": 16, "dtype": torch.float32, "device": "cpu"}
    roomy = GpuRunner(tiny_whisper_recipe(), cross_blocks=256, memo=0, **sizes)
    tight = GpuRunner(tiny_whisper_recipe(), cross_blocks=16, memo=1, **sizes)  # two 2 s windows at a time
    try:
        want = [f.result(timeout=120) for f in roomy.submit(clips, [False] * len(clips))]
        got = [f.result(timeout=120) for f in tight.submit(clips, [False] * len(clips))]
        too_long = tight.submit([AsrInput(rng.normal(0, 0.1, 16000 * 20).astype(np.float32))], [False])[0]
        with pytest.raises(CapacityExhausted):
            too_long.result(timeout=60)
    finally:
        roomy.close()
        tight.close()
    assert [g.text for g in got] == [w.text for w in want]  # confidences differ in the last float bits by batch
    assert [g.confidence for g in got] == pytest.approx([w.confidence for w in want], rel=1e-5)
    assert tight.room() == tight.max_pending and tight.engine.stats().cross_blocks_used <= 16


def test_with_the_pool_full_partials_and_windows_that_can_never_fit_fail_at_once_and_a_failed_step_counts_once(
        ) -> None:
    """Only commits wait for a cross-attention entry: a partial that does not fit fails at once (a newer one
    replaces it; the executor does not retry partials) and so does a window larger than the whole pool, while
    sequences still run. A step that raises fails what is in flight once: the runner's room comes back to its
    maximum, not past it (a failed item counted off twice widened it for good)."""
    import numpy as np

    from lingua_fusion.errors import BackendError, CapacityExhausted
    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    rng = np.random.default_rng(2)
    clip = lambda s: AsrInput(rng.normal(0, 0.1, int(16000 * s)).astype(np.float32))  # noqa: E731
    runner = GpuRunner(tiny_whisper_recipe(), blocks=256, cross_blocks=16, memo=0, block_size=8, cross_block_size=16,
                       dtype=torch.float32, device="cpu")  # two 2 s windows at a time
    try:
        items = [clip(2) for _ in range(4)] + [clip(2), clip(2), clip(20)]
        futures = runner.submit(items, [False] * 4 + [True, True, False])
        assert all(f.result(timeout=120).text is not None for f in futures[:4])  # the commits all ran
        for f in futures[4:]:
            assert isinstance(f.exception(timeout=60), CapacityExhausted)
        real_step, calls = runner.engine.step, [0]

        def failing_step() -> int:  # the first step of the next batch raises (a CUDA error, say)
            calls[0] += 1
            if calls[0] == 1:
                raise RuntimeError("the test's device error")
            return real_step()

        runner.engine.step = failing_step  # type: ignore[method-assign]
        futures = runner.submit([clip(2) for _ in range(6)], [False] * 6)
        outcomes = [f.exception(timeout=120) for f in futures]
        assert any(isinstance(e, BackendError) for e in outcomes)
        for _ in range(100):  # settled on the runner's thread
            if runner.room() == runner.max_pending:
                break
            time.sleep(0.05)
    finally:
        runner.close()
    assert runner.room() == runner.max_pending


def test_an_item_cancelled_while_it_waits_is_not_encoded_or_decoded() -> None:
    """A caller that gave up (the engine MT's timeout cancels its late futures) leaves its waiting items behind:
    the runner skips them instead of spending an encoder batch and a decode on results nobody reads, and they
    leave its count."""
    import threading as th

    import numpy as np

    from lingua_fusion.serving.gpu.runner import GpuRunner
    from lingua_fusion.serving.ports import AsrInput

    recipe = tiny_whisper_recipe()
    entered, release = th.Event(), th.Event()
    real_encode, encoded = recipe.encode, []

    def encode(payloads: list[Any]) -> Any:
        encoded.append(len(payloads))
        entered.set()
        release.wait(timeout=60)  # the first batch holds the runner's thread while the test queues and cancels
        return real_encode(payloads)

    recipe.encode = encode  # type: ignore[method-assign]
    runner = GpuRunner(recipe, blocks=128, cross_blocks=64, block_size=8, cross_block_size=16, dtype=torch.float32,
                       device="cpu", memo=0)
    rng = np.random.default_rng(3)
    clip = lambda: AsrInput(rng.normal(0, 0.1, 16000).astype(np.float32))  # noqa: E731
    try:
        first = runner.submit([clip()], [False])[0]
        assert entered.wait(timeout=60)
        gone, kept = runner.submit([clip(), clip()], [False, False])
        assert gone.cancel()
        release.set()
        assert first.result(timeout=60).text is not None and kept.result(timeout=60).text is not None
    finally:
        release.set()
        runner.close()
    assert encoded == [1, 1] and runner.room() == runner.max_pending
