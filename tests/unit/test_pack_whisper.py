"""bench/pack_whisper.py: the shipped tiny.en rewritten with int8 weight matrices (what travels to the GPU machine)
reads back through models/whisper_ct2.py with the same variables and shapes, its weights within half an int8 step
of the originals, and loads into the torch model; CTranslate2 itself accepts the file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from lingua_fusion.models.whisper_ct2 import read_ct2, state_dict, whisper_dims

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pack_whisper.py"


def _pack_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pack_whisper", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    mod = _pack_module()
    src = mod.shipped_tiny_en()
    out = tmp_path_factory.mktemp("packed") / "tiny.en-int8"
    sizes = mod.pack(src, out)
    assert sizes["packed_model_bin_mb"] <= 45 < sizes["source_model_bin_mb"]  # under the 64 MiB a GPU call carries
    return src, out


def test_packed_weights_dequantise_within_an_int8_step(packed: tuple[Path, Path]) -> None:
    src, out = packed
    orig, back = read_ct2(src / "model.bin"), read_ct2(out / "model.bin")
    assert (back.spec, back.revision, back.aliases) == (orig.spec, orig.revision, orig.aliases)
    assert whisper_dims(back) == whisper_dims(orig)
    quantised = [n for n, v in back.variables.items() if v.dtype == "int8" and v.shape and n.endswith("/weight")]
    assert "decoder/embeddings/weight" in quantised and "encoder/conv2/weight" in quantised
    assert len(quantised) == 4 * 4 + 4 * 7 + 3  # 4 per encoder layer, 7 per decoder layer, 2 convs, the embedding
    for name, var in orig.variables.items():
        got = back.variables[name]
        assert got.shape == var.shape, name
        if name not in quantised:
            assert got.dtype == var.dtype and np.array_equal(got.data, var.data), name
            continue
        w, deq = orig.float_tensor(name), back.float_tensor(name)
        step = 1.0 / back.variables[name + "_scale"].data.reshape((-1,) + (1,) * (len(var.shape) - 1))
        assert np.all(np.abs(deq - w) <= step / 2 + 1e-6), name
        assert np.abs(deq - w).max() > 0, name  # really quantised, not copied
    assert set(back.variables) == set(orig.variables) | {n + "_scale" for n in quantised}
    for side in ("config.json", "tokenizer.json"):
        assert (out / side).read_bytes() == (src / side).read_bytes()


def test_packed_model_loads_into_torch_and_ctranslate2(packed: tuple[Path, Path]) -> None:
    src, out = packed
    orig, back = state_dict(read_ct2(src / "model.bin")), state_dict(read_ct2(out / "model.bin"))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in orig.items()}
    ctranslate2 = pytest.importorskip("ctranslate2")
    model = ctranslate2.models.Whisper(str(out), device="cpu", compute_type="int8")
    assert not model.is_multilingual
