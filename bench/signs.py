"""Sign and lip figures: recogniser accuracy on a held-out synthetic set vs vocabulary size and examples per sign,
the per-frame cost of each mediapipe extractor (hands, face mesh / lips, pose) on real frames, and frames analysed
vs decoded under adaptive sampling.

    .venv/bin/python bench/signs.py --json bench/results/signs.json          (about 3 minutes on 2 cores)

Held-out set: for every taught sign, performances never taught (other speed, unevenness, position, size, 30 %
left-handed, 3 % of frames without the hand, detector noise); "unseen" are signs of another vocabulary (the same
generator, another seed), which should come back "unknown".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def accuracy(kind: str, sizes: list[int], per_sign: list[int], queries: int, unseen: int) -> list[dict[str, Any]]:
    from lingua_fusion.vision import synthetic as syn
    from lingua_fusion.vision.recogniser import UNKNOWN, Recogniser

    rows = []
    for size in sizes:
        if kind == "sign":
            specs: list[Any] = syn.sign_vocabulary(size, seed=3)
            others: list[Any] = syn.sign_vocabulary(unseen, seed=99)
            perform: Any = syn.perform_sign
        else:
            specs = syn.lip_vocabulary([f"w{i}" for i in range(size)], seed=2)
            others = syn.lip_vocabulary([f"x{i}" for i in range(unseen)], seed=77)
            perform = syn.perform_lips
        for k in per_sign:
            rng = np.random.default_rng(1000 * size + k)
            taught = [(s.gloss, perform(s, syn.random_performance(rng, mirrored=False), rng))
                      for s in specs for _ in range(k)]
            rec = Recogniser.teach(kind, taught)
            right = wrong = unknown = 0
            t0 = time.perf_counter()
            for s in specs:
                for _ in range(queries):
                    got = rec.recognise(perform(s, syn.random_performance(rng), rng)).gloss
                    right += got == s.gloss
                    unknown += got == UNKNOWN
                    wrong += got not in (s.gloss, UNKNOWN)
            ms = (time.perf_counter() - t0) * 1000 / (len(specs) * queries)
            accepted = sum(rec.recognise(perform(s, syn.random_performance(rng), rng)).gloss != UNKNOWN
                           for s in others)
            n = len(specs) * queries
            rows.append({"kind": kind, "vocabulary": size, "examples_per_gloss": k, "queries": n,
                         "accuracy": round(right / n, 3), "wrong": round(wrong / n, 3),
                         "unknown": round(unknown / n, 3), "unseen_accepted": round(accepted / len(others), 3),
                         "radius": round(rec.radius, 3), "ms_per_query": round(ms, 2)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def extractor_cost(frames: int) -> dict[str, Any]:
    """ms per frame of each part on real frames: a rendered moving hand (hands), a photographed face moved across
    the picture (face mesh and pose). ``inference`` is mediapipe's own time in the worker; ``round_trip`` adds the
    frame's trip through the pipe (640 x 480 RGB)."""
    import matplotlib
    from PIL import Image

    from lingua_fusion.vision.extractor import MediapipeExtractor
    from lingua_fusion.vision.synthetic import render_hand

    hand = [(i / 15, render_hand((0.3 + 0.4 * i / (frames - 1), 0.75))) for i in range(frames)]
    img = np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
                     .convert("RGB"))[:470]
    face = []
    for i in range(frames):
        canvas = np.full((480, 640, 3), 90, np.uint8)
        dx = 4 * i
        canvas[5:5 + img.shape[0], dx:dx + img.shape[1]] = img[:, :min(img.shape[1], 640 - dx)]
        face.append((i / 15, canvas))
    out: dict[str, Any] = {"frames": frames, "frame_size": [640, 480]}
    for part, clip in (("hands", hand), ("lips", face), ("pose", face)):
        ex = MediapipeExtractor(session=f"bench-{part}")
        try:
            ex.extract(clip[:3], parts=frozenset({part}))  # start the worker, load the model
            before = ex.timings[part]
            t0 = time.perf_counter()
            got = ex.extract(clip, parts=frozenset({part}))
            wall = time.perf_counter() - t0
            found = sum(f.any_hand if part == "hands" else f.lips_present if part == "lips" else f.pose_present
                        for f in got)
            out[part] = {"inference_ms_per_frame": round((ex.timings[part] - before) / frames, 2),
                         "round_trip_ms_per_frame": round(wall * 1000 / frames, 2), "found_in": found}
        finally:
            ex.close()
        print(json.dumps({part: out[part]}), file=sys.stderr)
    return out


def sampling(seconds_still: float, seconds_moving: float, fps: int) -> dict[str, Any]:
    """A 30 fps clip: still, then a hand sweeping back and forth, then still again; the real extractor feeds the
    sampler its hand positions. Compared with analysing every decoded frame."""
    from lingua_fusion.vision.extractor import MediapipeExtractor
    from lingua_fusion.vision.sampler import AdaptiveSampler, SamplingPolicy
    from lingua_fusion.vision.synthetic import render_hand

    policy = SamplingPolicy(min_fps=2, max_fps=15, budget_fps=10, burst=8)
    sampler = AdaptiveSampler(policy)
    ex = MediapipeExtractor(session="bench-sampling")
    rest = render_hand((0.3, 0.75))
    phases = [("still", seconds_still), ("moving", seconds_moving), ("still again", seconds_still)]
    per_phase = []
    t = 0.0
    try:
        for name, length in phases:
            decoded_before, analysed_before = sampler.decoded, sampler.analysed
            for i in range(int(length * fps)):
                if name == "moving":
                    u = (i / fps) / 1.5  # one sweep every 1.5 s
                    x = 0.3 + 0.4 * (1 - abs(2 * (u % 1) - 1))
                    frame = render_hand((x, 0.75))
                else:
                    frame = rest
                if sampler.offer(t, frame):
                    sampler.observe(ex.extract([(t, frame)], parts=frozenset({"hands"}))[0])
                t += 1 / fps
            per_phase.append({"phase": name, "seconds": length, "decoded": sampler.decoded - decoded_before,
                              "analysed": sampler.analysed - analysed_before})
    finally:
        ex.close()
    return {"policy": policy.__dict__, "fps": fps, "phases": per_phase, "decoded": sampler.decoded,
            "analysed": sampler.analysed, "over_budget": sampler.over_budget,
            "analysed_share": round(sampler.analysed / sampler.decoded, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "signs.json")
    ap.add_argument("--queries", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from lingua_fusion.lab.fixtures import git_commit, machine

    sizes = [5, 10] if args.quick else [5, 10, 20, 50]
    report: dict[str, Any] = {"commit": git_commit(), "machine": machine(),
                              "signs": accuracy("sign", sizes, [1, 3, 5], args.queries, 30),
                              "lips": accuracy("lip", [s for s in sizes if s <= 20], [1, 3, 5], args.queries, 30),
                              "extractor": extractor_cost(10 if args.quick else 30),
                              "sampling": sampling(5.0, 5.0, 30)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
