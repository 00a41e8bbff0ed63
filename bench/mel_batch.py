"""The log-mel front end of a GPU runner's batch start: clip by clip against every clip in one call.

A profiler window over a model process at 2,000 streams on the H200 (bench/gpu_trace.py,
``bench/results/gpu_trace_2000.json``) found its ASR runner's thread 925 ms of 1.5 s in one batch start of 373
clips, most of it the benchmark recipe's log-mel taken clip by clip (a dozen small operators and a copy to the
device each), while the GPU ran this process's kernels 2.9 % of the window. ``LogMel.ragged`` takes them all in
one call. This measures both on this machine's CPU, with torch on one thread: the operators dispatched (the count
is the same on any device, and on a GPU each is a kernel launch) and the wall time per batch (the median of
``--rounds``), for clips of 0.5-6 s as partials and commits bring them. On a CPU the one call is slower: the batch
is padded to its longest clip and its intermediates (complex spectra of every clip) outgrow the caches, so the
arithmetic costs more than the dispatches saved; the benchmark's recipe takes it on CUDA only, where the
arithmetic is microseconds and each dispatch is a launch holding Python's lock. Not yet timed on the GPU.

    .venv/bin/python bench/mel_batch.py --json bench/results/mel_batch.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.models.whisper_torch import LogMel  # noqa: E402


def ops(fn: Any) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def median_s(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--batches", default="32,128,373")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    mel = LogMel(80)
    rng = np.random.default_rng(0)
    rows = []
    for n in (int(b) for b in args.batches.split(",")):
        clips = [rng.normal(0, 0.1, int(rng.uniform(0.5, 6.0) * 16000)).astype(np.float32) for _ in range(n)]

        def one_by_one(clips: list[np.ndarray] = clips) -> list[torch.Tensor]:
            return [mel(torch.from_numpy(c)[None])[0] for c in clips]

        def ragged(clips: list[np.ndarray] = clips) -> tuple[torch.Tensor, list[int]]:
            return mel.ragged(clips)

        one_by_one(), ragged()  # warm-up
        row = {"clips": n, "audio_s": round(sum(len(c) for c in clips) / 16000, 1),
               "ops_clip_by_clip": ops(one_by_one), "ops_one_call": ops(ragged)}
        a, b = [], []
        for _ in range(args.rounds):  # alternating rounds: the machine's noise falls on both
            a.append(median_s(one_by_one, 1))
            b.append(median_s(ragged, 1))
        row["ms_clip_by_clip"] = round(float(np.median(a)) * 1000, 1)
        row["ms_one_call"] = round(float(np.median(b)) * 1000, 1)
        row["speedup"] = round(row["ms_clip_by_clip"] / row["ms_one_call"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"what": "log-mel of a batch start, clip by clip vs LogMel.ragged, torch on 1 CPU thread",
              "machine": machine(), "commit": git_commit(), "rounds": args.rounds, "rows": rows}
    args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
