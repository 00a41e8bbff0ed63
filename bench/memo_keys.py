"""What a GPU runner's thread spends keying its encoder memo (serving/gpu/memo.py), per started item: every window
hashed in full (blake2b, the memo before prefilters) against partials hashed and commits only prefiltered.

    .venv/bin/python bench/memo_keys.py [--json bench/results/memo_keys.json]

A stream's items as the H100 run of 2026-12-07 had them: a partial for every three finals (0.13 against 0.42 an
item a stream-second), windows of 2-30 s in 2 s steps (the recipe's widths), half of them 10 s or less. Each arm
keys the same items, ABAB, the least of 5 rounds; the figure is the thread's milliseconds an item.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lingua_fusion.serving.gpu.memo import EncoderMemo, audio_key, audio_prefilter


class Audio:
    def key(self, payload: np.ndarray) -> bytes:
        return audio_key(payload)


class Prefiltered(Audio):
    def prefilter(self, payload: np.ndarray) -> bytes:
        return audio_prefilter(payload)


def items(n: int, seed: int = 0) -> list[tuple[np.ndarray, bool]]:
    rng = np.random.default_rng(seed)
    widths = rng.choice([2, 4, 6, 8, 10, 12, 16, 20, 30], size=n, p=[.1, .15, .15, .1, .1, .1, .1, .1, .1])
    return [(rng.normal(0, 0.1, 16000 * int(w)).astype(np.float32), bool(rng.random() < 0.25)) for w in widths]


def ms_per_item(recipe: Audio, work: list[tuple[np.ndarray, bool]]) -> tuple[float, int]:
    memo = EncoderMemo(recipe, size=2048)
    t = time.perf_counter()
    for i, (audio, tentative) in enumerate(work):
        keys, filters = memo.keys([audio], [tentative])
        if keys[0] is not None:
            memo.keep(keys[0], i, filters[0])
    return 1000 * (time.perf_counter() - t) / len(work), memo.hashed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = items(args.items)
    best: dict[str, float] = {"all_hashed": float("inf"), "prefiltered": float("inf")}
    hashed: dict[str, int] = {}
    for _ in range(5):
        for arm, recipe in (("all_hashed", Audio()), ("prefiltered", Prefiltered())):
            ms, hashed[arm] = ms_per_item(recipe, work)
            best[arm] = min(best[arm], ms)
    report = {"bench": "memo_keys", "items": len(work), "partials": sum(t for _, t in work),
              "ms_per_item": {k: round(v, 3) for k, v in best.items()}, "full_hashes": hashed,
              "ratio": round(best["all_hashed"] / best["prefiltered"], 2)}
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
