"""Where a large landmark body's time goes, in-process (no server): strict JSON parsing, the landmark checks, the
JSON form written back, the store's write, the export, and the cyclic GC's passes during a 16 MB parse.

    .venv/bin/python bench/vocab_profile.py      # JSON: bench/results/vocab_profile.json

The best of 3 runs for each step (1 for the slow ones), in ms. The old path's steps (``strict_json.loads``,
``json.dumps``, FastAPI's ``jsonable_encoder`` of the export) are timed next to ``vision.bigjson``'s.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion import strict_json  # noqa: E402
from lingua_fusion.vision import bigjson  # noqa: E402
from lingua_fusion.vision.landmarks import LandmarkSeq  # noqa: E402
from lingua_fusion.vision.store import VocabularyStore  # noqa: E402


def frames(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)

    def pts(k: int) -> list[list[float]]:
        return (0.3 + 0.4 * rng.random((k, 2))).round(5).tolist()

    return [{"t": i / 30, "left_hand": pts(21), "right_hand": pts(21), "pose": pts(33), "lips": pts(40)}
            for i in range(n)]


def best(fn: Callable[[], Any], n: int = 3) -> tuple[float, Any]:
    out, took = None, float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        took = min(took, time.perf_counter() - t0)
    return round(took * 1000, 1), out


def gc_passes(fn: Callable[[], Any]) -> list[float]:
    """The generation-2 collections (ms) while ``fn`` runs."""
    passes: list[float] = []
    start = [0.0]

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        elif info["generation"] == 2:
            passes.append(round((time.perf_counter() - start[0]) * 1000, 1))

    gc.callbacks.append(cb)
    try:
        fn()
    finally:
        gc.callbacks.remove(cb)
    return passes


def main() -> None:
    from fastapi.encoders import jsonable_encoder

    body = json.dumps({"gloss": "hello", "frames": frames(2000, 0)}).encode()
    big = json.dumps({"gloss": "big", "frames": frames(7000, 1)}).encode()
    ms: dict[str, float] = {}
    ms["strict_json.loads"], doc = best(lambda: strict_json.loads(body))
    ms["bigjson.loads"], _ = best(lambda: bigjson.loads(body))
    ms["LandmarkSeq.from_json"], seq = best(lambda: LandmarkSeq.from_json(doc["frames"]))
    ms["seq.to_json"], as_json = best(lambda: seq.to_json())
    ms["json.dumps(to_json)"], _ = best(lambda: json.dumps(as_json))
    with tempfile.TemporaryDirectory() as tmp:
        store = VocabularyStore(Path(tmp))
        vid = store.create("k", "bench", "sign").vocab_id
        ms["store.add_example"], _ = best(lambda: store.add_example("k", vid, "hello", seq))
        ms["store.export_json (3 examples)"], exported = best(lambda: store.export_json("k", vid))
        old_export = json.loads(exported)
        ms["jsonable_encoder(export) (old route)"], _ = best(lambda: jsonable_encoder(old_export), n=1)
        store.close()
    result = {"command": "python bench/vocab_profile.py", "body_bytes": len(body), "export_bytes": len(exported),
              "big_body_bytes": len(big), "ms": ms,
              "gc_gen2_passes_ms": {"json.loads (16 MB class body)": gc_passes(lambda: json.loads(big)),
                                    "bigjson.loads": gc_passes(lambda: bigjson.loads(big))}}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench/results/vocab_profile.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
