"""User-supplied MT model directories (LocalDirMT): a tiny random Marian model built here, in transformers and
in CTranslate2 format, loaded from its ``linguafusion.json`` manifest and routed to by Registry and FileTranslator.

Random weights translate into nonsense, so only shapes, types, determinism and routing are checked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lingua_fusion.config import Settings
from lingua_fusion.errors import BackendError
from lingua_fusion.files import FileRequest, FileTranslator
from lingua_fusion.models.mt_local import MANIFEST, LocalDirMT

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

CORPUS = ["hello world", "good morning everyone", "the cat sat on the mat", "你好 世界", "早上 好 大家"]
MANIFEST_BODY = {"name": "tiny-marian", "pairs": [["en", "zh"]]}


def build_tiny_marian(path: Path) -> Path:
    """A word-level tokenizer trained on CORPUS plus a 1-layer, d_model=16 Marian with seeded random weights.

    Marian conventions: ``</s>`` is id 0, ``<pad>`` is the last id and starts the decoder (CTranslate2's
    Marian converter drops that last row), and the encoder input ends with ``</s>``.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["</s>", "<unk>"]))
    tk.add_special_tokens(["<pad>"])  # -> the last id
    eos = tk.token_to_id("</s>")
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                      special_tokens=[("</s>", eos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    assert tok.pad_token_id == len(tok) - 1 and tok.eos_token_id == 0

    torch.manual_seed(0)
    config = MarianConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                          decoder_ffn_dim=32,
                          max_position_embeddings=512,  # LocalDirMT decodes up to 256 new tokens
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          decoder_start_token_id=tok.pad_token_id, forced_eos_token_id=tok.eos_token_id)
    model = MarianMTModel(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / MANIFEST).write_text(json.dumps(MANIFEST_BODY))
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_marian(tmp_path_factory.mktemp("user-mt") / "tiny-marian")


@pytest.fixture(scope="module")
def ct2_dir(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    out = tmp_path_factory.mktemp("user-mt-ct2") / "tiny-marian-ct2"
    TransformersConverter(str(hf_dir)).convert(str(out))
    assert (out / "model.bin").exists()
    for f in hf_dir.iterdir():  # the converter writes only the model and its vocabulary
        if f.name.startswith("tokenizer") or f.name in {"special_tokens_map.json", MANIFEST}:
            shutil.copy(f, out / f.name)
    return out


def _check_backend(mt: LocalDirMT, fmt: str) -> None:
    assert mt.format == fmt
    assert mt.info.name == "tiny-marian"
    assert ("en", "zh") in mt.info.pairs
    first = mt.translate(["hello world"], "en", "zh")
    assert isinstance(first, list) and len(first) == 1 and isinstance(first[0], str)
    assert mt.translate(["hello world"], "en", "zh") == first  # beam search on fixed weights: deterministic
    batch = mt.translate(["hello world", "good morning everyone"], "en", "zh")
    assert len(batch) == 2 and all(isinstance(t, str) for t in batch)
    assert mt.translate([], "en", "zh") == []
    with pytest.raises(BackendError, match="does not serve"):
        mt.translate(["hello world"], "zh", "en")
    with pytest.raises(BackendError):
        mt.translate(["hello world"], "en", "es")


def test_transformers_directory(hf_dir: Path) -> None:
    assert (hf_dir / "config.json").exists() and not (hf_dir / "model.bin").exists()
    _check_backend(LocalDirMT(hf_dir), "transformers")


def test_ctranslate2_directory(ct2_dir: Path) -> None:
    _check_backend(LocalDirMT(ct2_dir), "ctranslate2")


def test_missing_or_bad_manifest(hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=MANIFEST):
        LocalDirMT(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    (bad / MANIFEST).write_text(json.dumps({"name": "x"}))  # no "pairs"
    with pytest.raises(BackendError, match=MANIFEST):
        LocalDirMT(bad)


def test_registry_and_engine_route_to_user_dir(hf_dir: Path, tmp_path: Path) -> None:
    settings = Settings()
    settings.state_dir = tmp_path / "state"
    settings.models.user_mt_dirs = [hf_dir]

    engine = FileTranslator(settings)
    try:
        route = engine.registry.mt_route("en", "zh")
        assert route.legs[0].backend == "user:0"
        assert len(route.legs) == 1 and route.pivot is None
        assert not route.low_confidence
        assert "en-zh" in engine.registry.served_pairs()

        result = engine.translate(FileRequest(source_modality="text", text="hello world", source_lang="en",
                                              target_lang="zh"))
        assert result.models["mt"] == "tiny-marian"
        assert result.source_text == "hello world" and isinstance(result.text, str)
        assert not result.low_confidence and result.pivot is None
        assert "user:0" in engine.registry.loaded()
    finally:
        engine.close()
