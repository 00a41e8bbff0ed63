"""MT on the continuous engine (issue 12): a user's transformers model directory decoded by a GpuRunner behind
the same MT backend face, on the CPU. Greedy output equals the model's own ``generate(num_beams=1)``; with
``LINGUAFUSION_MODELS__ENGINE=continuous`` the server's REST text requests and live streams translate through the
engine while glossaries, names and the translation memory around it work as they do on the CPU runner.

The models are tiny and random (tests/service/test_user_model_dir.py builds them): weights drawn wider than the default
init so that each input gets its own translation and its own length, and the tokenizer knows the glossary's
placeholder token (``[900]``) so that a placeholder can come back through the model.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import metric, start_server, stop_server
from test_user_model_dir import build_tiny_marian

from lingua_fusion import MultimodalTranslator
from lingua_fusion.config import Settings
from lingua_fusion.glossary import Term
from lingua_fusion.models.mt_local import MANIFEST, LocalDirMT
from lingua_fusion.models.registry import Registry
from lingua_fusion.observability import Metrics
from lingua_fusion.serving.gpu.server import build_executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import CallContext, MtInput

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lingua_fusion.serving.gpu.torch_mt import EngineMT, engine_mt  # noqa: E402

TEXTS = ["hello world", "good morning everyone the cat sat on the mat", "the cat", "你好 世界", "mat",
         "早上 好 大家 hello", "sat on the mat", "[900] world", "good [900] everyone", "[900]"]
PLACEHOLDER = "[900]"  # glossary.PLACEHOLDER's first key
TM_HITS = 'linguafusion_tm_lookups_total{result="hit_local"}'
ENGINE_CPU = {"engine": "continuous", "device": "cpu"}


def lively(model: torch.nn.Module, seed: int, std: float = 0.3) -> None:
    """Redraw the matrices (not the fixed sinusoidal positions) wider than the default init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_marian(path: Path, *, seed: int, eos_bias: float, placeholder_bias: float = 0.0) -> Path:
    """The tiny Marian of test_user_model_dir, with ``[900]`` in its vocabulary, its matrices redrawn from ``seed``
    and the output biased towards end-of-sentence and the placeholder."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    base = build_tiny_marian(path.parent / (path.name + "-base"))
    shutil.copytree(base, path)
    tok = AutoTokenizer.from_pretrained(str(base))
    tok.add_tokens([PLACEHOLDER])
    model = AutoModelForSeq2SeqLM.from_pretrained(str(base))
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    lively(model, seed)
    with torch.no_grad():
        model.final_logits_bias.zero_()
        model.final_logits_bias[0, tok.eos_token_id] = eos_bias
        model.final_logits_bias[0, tok.convert_tokens_to_ids(PLACEHOLDER)] = placeholder_bias
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_m2m100(path: Path) -> Path:
    """A tiny M2M100 (NLLB-200's architecture): pad 1, end-of-sentence 2 starts the decoder, the target language's
    code forced as the first token (``lang_codes`` in the manifest), the source's code before the text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import M2M100Config, M2M100ForConditionalGeneration, PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [t for t in TEXTS if PLACEHOLDER not in t]
    tk.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["<s>", "<pad>", "</s>", "<unk>",
                                                                            "__en__", "__zh__"]))
    tk.post_processor = processors.TemplateProcessing(
        single="__en__ $A </s>", special_tokens=[("__en__", tk.token_to_id("__en__")), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                  unk_token="<unk>", additional_special_tokens=["__en__", "__zh__"])
    assert (tok.pad_token_id, tok.eos_token_id) == (1, 2)
    config = M2M100Config(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=2,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                          decoder_ffn_dim=32, max_position_embeddings=300, scale_embedding=True,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    model = M2M100ForConditionalGeneration(config).eval()
    lively(model, seed=6, std=0.5)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / MANIFEST).write_text(json.dumps({"name": "tiny-m2m100", "pairs": [["en", "zh"]],
                                             "lang_codes": {"en": "__en__", "zh": "__zh__"}}))
    return path


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each of TEXTS gets its own translation, 36 to 254 tokens long."""
    return build_marian(tmp_path_factory.mktemp("engine-mt") / "tiny-marian", seed=2, eos_bias=1.0)


@pytest.fixture(scope="module")
def terse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Short translations (a few tokens, within the executor's output-length check) that carry ``[900]``: the
    placeholder of a protected glossary term comes back. Not a translation that depends much on its input."""
    return build_marian(tmp_path_factory.mktemp("engine-mt") / "terse-marian", seed=3, eos_bias=3.0,
                        placeholder_bias=2.0)


def _engine(local: LocalDirMT) -> EngineMT:
    mt = engine_mt(local, Settings(models=ENGINE_CPU), "mt:test")  # type: ignore[arg-type]
    assert mt is not None
    return mt


def _generate(local: LocalDirMT, texts: list[str], **kwargs: object) -> list[str]:
    """The model's own greedy decoding of ``texts`` as one padded batch."""
    enc = local._tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return local.detokenize(local.model.generate(**enc, num_beams=1, max_new_tokens=256, **kwargs))


def test_marian_engine_equals_generate_greedy(marian_dir: Path) -> None:
    local = LocalDirMT(marian_dir)
    expected = _generate(local, TEXTS)
    lengths = [len(t.split()) for t in expected]
    assert len(set(expected)) == len(TEXTS) and min(lengths) >= 10 and len(set(lengths)) >= 8, expected
    mt = _engine(local)
    try:
        assert mt.translate(TEXTS, "en", "zh") == expected
        # two callers at once: the second batch joins the first one's running batch, reversed and overlapping
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(mt.translate, TEXTS[:6], "en", "zh")
            second = pool.submit(mt.translate, TEXTS[::-1], "en", "zh")
            assert first.result(timeout=120) == expected[:6]
            assert second.result(timeout=120) == expected[::-1]
        assert mt.runner.encoded == len(TEXTS)  # the same source text again reuses its encoder output
        assert mt.translate([], "en", "zh") == []
        assert mt.info.name == "tiny-marian-continuous"
    finally:
        mt.close()


def test_m2m100_engine_equals_generate_greedy(tmp_path: Path) -> None:
    local = LocalDirMT(build_m2m100(tmp_path / "tiny-m2m100"))
    zh = local.target_token("zh")
    texts = [t for t in TEXTS if PLACEHOLDER not in t]
    expected = _generate(local, texts, forced_bos_token_id=zh)
    assert len(set(expected)) == len(texts), expected
    mt = _engine(local)
    try:
        assert mt.prompt("zh") == (2, zh)
        assert mt.translate(texts, "en", "zh") == expected
    finally:
        mt.close()


def test_generation_config_the_engine_cannot_follow_stays_on_cpu(marian_dir: Path, tmp_path: Path) -> None:
    from transformers import GenerationConfig

    path = tmp_path / "no-repeat"
    shutil.copytree(marian_dir, path)
    gen = GenerationConfig.from_pretrained(str(path))
    gen.no_repeat_ngram_size = 3
    gen.save_pretrained(str(path))
    assert engine_mt(LocalDirMT(path), Settings(models=ENGINE_CPU), "mt:x") is None  # type: ignore[arg-type]


def test_the_directorys_own_max_new_tokens_bounds_every_translation_as_generate_does(marian_dir: Path,
                                                                                     tmp_path: Path) -> None:
    """A directory whose generation config caps translations at 12 new tokens: the engine and the CPU backend stop
    there as ``generate`` does (the GPU benchmark's random-weight Marian relies on it: it never ends by itself)."""
    from transformers import GenerationConfig

    path = tmp_path / "capped"
    shutil.copytree(marian_dir, path)
    gen = GenerationConfig.from_pretrained(str(path))
    gen.max_new_tokens = 12
    gen.save_pretrained(str(path))
    local = LocalDirMT(path)
    with torch.no_grad():
        enc = local._tok(TEXTS, return_tensors="pt", padding=True)
        expected = local.detokenize(local.model.generate(**enc, num_beams=1))  # its config's limit
    uncapped = _generate(LocalDirMT(marian_dir), TEXTS)
    assert expected != uncapped and all(u.startswith(e) for e, u in zip(expected, uncapped, strict=True))
    mt = _engine(local)
    try:
        assert mt.plan.max_new == 12
        assert mt.translate(TEXTS, "en", "zh") == expected
    finally:
        mt.close()


def _registry(tmp_path: Path, dirs: list[Path]) -> tuple[Settings, Registry]:
    settings = Settings(models={**ENGINE_CPU, "user_mt_dirs": dirs})  # type: ignore[arg-type]
    settings.state_dir = tmp_path / "state"
    return settings, Registry(settings)


async def test_executor_mt_through_the_engine_with_glossary_and_memory(terse_dir: Path, tmp_path: Path) -> None:
    settings, registry = _registry(tmp_path, [terse_dir])
    metrics = Metrics()
    executor = build_executor(registry, settings, metrics)
    key, ctx = ModelKey.mt("en", "zh"), CallContext(stream_id="s1")
    term = Term("hello", "HOLA")
    try:
        plain = await executor.run(key, MtInput("good morning everyone"), ctx)
        termed = await executor.run(key, MtInput("hello world", glossary=(term,)), ctx)
        backend = registry.mt("user:0")
        assert isinstance(backend, EngineMT)
        encoded = backend.runner.encoded
        hits = registry.translation_memory().stats.hits_local
        again = await executor.run(key, MtInput("hello world", glossary=(term,)), ctx)
    finally:
        await executor.close()
        registry.close()
    assert plain == _generate(LocalDirMT(terse_dir), ["good morning everyone"])[0]
    # the glossary's placeholder went through the engine and came back as the term
    protected = _generate(LocalDirMT(terse_dir), [f"{PLACEHOLDER} world"])[0]
    assert PLACEHOLDER in protected and termed == protected.replace(PLACEHOLDER, "HOLA")
    assert again == termed and backend.runner.encoded == encoded  # a translation-memory hit: the engine idle
    assert registry.translation_memory().stats.hits_local == hits + 1


def test_ctranslate2_directory_stays_on_cpu(marian_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    base = marian_dir.parent / (marian_dir.name + "-base")  # Marian's pad as the last id, as the converter wants
    ct2 = tmp_path / "ct2"
    TransformersConverter(str(base)).convert(str(ct2))
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name in {"special_tokens_map.json", MANIFEST}:
            shutil.copy(f, ct2 / f.name)
    settings, registry = _registry(tmp_path, [ct2, marian_dir])
    build_executor(registry, settings, Metrics())
    try:
        assert type(registry.mt("user:0")) is LocalDirMT and isinstance(registry.mt("user:1"), EngineMT)
        names = [m["name"] for m in registry.capabilities() if m["name"].startswith("tiny-marian")]
        assert names == ["tiny-marian", "tiny-marian", "tiny-marian-continuous"]  # the engine row: user:1 only
    finally:
        registry.close()


# ---- a real server --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mt_server(terse_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, proc = start_server(tmp_path_factory.mktemp("engine-mt-server"), "--no-auth",
                             env={"LINGUAFUSION_MODELS__ENGINE": "continuous", "LINGUAFUSION_MODELS__DEVICE": "cpu",
                                  "LINGUAFUSION_MODELS__USER_MT_DIRS": json.dumps([str(terse_dir)])})
    yield url
    stop_server(proc)



@pytest.mark.slow
async def test_server_text_and_stream_through_the_engine(mt_server: str, terse_dir: Path) -> None:
    local = LocalDirMT(terse_dir)
    t = MultimodalTranslator(base_url=mt_server)
    models = httpx.get(mt_server + "/v1/models", timeout=10).json()["models"]
    row = [m for m in models if m["name"] == "tiny-marian-continuous"]
    assert row and row[0]["task"] == "mt" and "continuous engine (cpu)" in row[0]["quality"]

    # a text request: the engine's greedy translation, the glossary term through its placeholder
    gid = t.upload_glossary({"hello": "HOLA"})
    r = await asyncio.to_thread(t.translate, text="hello world", source_lang="en", target_lang="zh",
                                enable_glossary=True, glossary_id=gid)
    assert r.models["mt"] == "tiny-marian-continuous"
    assert r.text == _generate(local, [f"{PLACEHOLDER} world"])[0].replace(PLACEHOLDER, "HOLA")
    assert r.glossary_terms_applied == [{"source": "hello", "target": "HOLA"}]
    hits = metric(httpx.get(mt_server + "/metrics", timeout=10).text, TM_HITS)
    again = await asyncio.to_thread(t.translate, text="hello world", source_lang="en", target_lang="zh",
                                    enable_glossary=True, glossary_id=gid)
    assert again.text == r.text
    text = httpx.get(mt_server + "/metrics", timeout=10).text
    assert metric(text, TM_HITS) == hits + 1  # the repeat came from the translation memory

    # a live stream's final: MT through the executor's MT key, on the same engine
    async with t.stream(["zh"], inputs=["text"], partials=False) as s:
        await s.send_text("good morning everyone")
        await s.end()
        finals = [e async for e in s if e.type == "final"]
    assert len(finals) == 1 and finals[0].source_text
    assert finals[0].text == _generate(local, [finals[0].source_text])[0]
    text = httpx.get(mt_server + "/metrics", timeout=10).text
    assert metric(text, 'linguafusion_gpu_pool_blocks{model="mt:user:0",pool="self",state="free"}') > 0
    assert metric(text, 'linguafusion_gpu_pool_bytes{model="mt:user:0",pool="cross"}') > 0
    assert metric(text, 'linguafusion_batch_size_count{model="mt:en-zh"}') >= 1
    assert metric(text, 'linguafusion_gpu_runner_steps_total{model="mt:user:0"}') >= 1  # its runner's own counters


def _host_reads(fn: object) -> int:
    """How many times ``fn()`` read a tensor's value back to the host (``bool(t)``, ``.item()``): on CUDA each
    waits for the GPU while holding Python's lock."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    with Reads():
        fn()  # type: ignore[operator]
    return Reads.n


@pytest.mark.parametrize(("dtype", "overflow"), [(torch.float32, False), (torch.float16, False),
                                                 (torch.float16, True)])
def test_the_marian_encoder_gives_the_same_output_without_reading_the_gpu_back(dtype: torch.dtype,
                                                                               overflow: bool) -> None:
    """The engine's Marian encoder (serving/gpu/hf_encoders.py) equals Hugging Face's, bit for bit, also where a
    float16 layer overflows and the guard clamps; and it reads nothing back per layer: an unpadded batch none at
    all, a padded one once (the mask check Hugging Face makes before the layers)."""
    import copy

    from gpu_models import hf_marian

    from lingua_fusion.serving.gpu.recipes import encoder_outputs

    model = hf_marian(seed=3).to(dtype)
    if overflow:  # half of one layer's features past float16's range: Hugging Face's guard clamps the layer
        with torch.no_grad():
            model.model.encoder.layers[0].final_layer_norm.bias[::2] = float("inf")
    reference = copy.deepcopy(model).get_encoder()
    pad = model.config.pad_token_id
    for ids in ([[5, 6, 7, 8], [9, 10, 11, 12]], [[5, 6, 7, 8, 9, 10], [11, 12]]):
        ours = encoder_outputs(model.get_encoder(), ids, pad, torch.device("cpu"))
        width = max(map(len, ids))
        batch = torch.tensor([seq + [pad] * (width - len(seq)) for seq in ids])
        mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in ids])
        with torch.inference_mode():
            theirs = reference(input_ids=batch, attention_mask=mask).last_hidden_state
        for row, seq in enumerate(ids):
            assert torch.isfinite(ours[row]).all()  # with an overflow: the guard clamped it
            assert torch.equal(ours[row], theirs[row, : len(seq)])
        reads = _host_reads(lambda ids=ids: encoder_outputs(model.get_encoder(), ids, pad, torch.device("cpu")))
        assert reads == (0 if len(set(map(len, ids))) == 1 else 1)
    if overflow:
        with torch.inference_mode():  # the case is real: the unguarded layer gives infinities
            x = reference.embed_tokens(torch.tensor([[5, 6, 7, 8]])) * reference.embed_scale
            h, _ = reference.layers[0].self_attn(x, attention_mask=None)
            h = reference.layers[0].self_attn_layer_norm(x + h)
            lyr = reference.layers[0]
            raw = lyr.final_layer_norm(h + lyr.fc2(lyr.activation_fn(lyr.fc1(h))))
        assert not torch.isfinite(raw).all()
