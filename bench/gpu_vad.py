"""VAD across streams: Silero v6 on onnxruntime, one call per stream (the CPU server's VAD lane, serving/threads.py)
against the torch port batched across streams (serving/gpu/silero.py, ``MODELS__GPU_VAD=silero``), both on this CPU.

Each stream brings ``--windows`` pending 32 ms windows of real speech (Piper reading the built-in sentences, 16 kHz;
16 windows = 0.5 s, one live chunk) from its own offset. A round times one VAD lane call over every stream: the
onnxruntime model called once per stream (1 intra-op thread, as faster-whisper opens it), and the torch runner called
once for all streams, with torch on 1 thread and on every core. Reports windows/s and the call's latency per
configuration at 1, 64 and 512 streams (the median of ``--rounds`` alternating rounds, with their min and max), and
the largest probability difference between the two.
Not run on a GPU here: the same torch runner runs there on its own CUDA stream.

    .venv/bin/python bench/gpu_vad.py --json bench/results/gpu_vad.json [--seconds 2] [--rounds 3] [--windows 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.models.vad import SileroVAD  # noqa: E402
from lingua_fusion.serving.gpu.silero import WINDOW, silero_vad  # noqa: E402

Call = Callable[[list[np.ndarray]], list[np.ndarray]]


def speech() -> np.ndarray:
    """The built-in sentences read by Piper, one after the other, at 16 kHz."""
    from lingua_fusion.lab.fixtures import builtin_sentences  # noqa: PLC0415
    from lingua_fusion.lab.loadgen.mix import _resample  # noqa: PLC0415
    from lingua_fusion.models.tts import PiperTTS  # noqa: PLC0415

    tts = PiperTTS()
    parts = []
    for _i, en, _es in builtin_sentences():
        pcm, sr = tts.synthesize(en, language="en")
        parts.append(_resample(pcm.astype(np.float32) / 32768, sr))
    return np.concatenate(parts).astype(np.float32)


def streams(track: np.ndarray, count: int, windows: int) -> list[np.ndarray]:
    n = windows * WINDOW
    offsets = (np.arange(count) * 7919 * WINDOW) % (len(track) - n)
    return [track[o: o + n].copy() for o in offsets]


def timed(call: Call, batch: list[np.ndarray], seconds: float) -> dict[str, Any]:
    """Calls over fresh copies of ``batch`` until ``seconds`` have passed (faster-whisper writes into its input)."""
    lat: list[float] = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop or len(lat) < 3:
        fresh = [a.copy() for a in batch]
        t0 = time.perf_counter()
        call(fresh)
        lat.append(time.perf_counter() - t0)
    per_call = float(np.median(lat))
    return {"windows_per_s": round(sum(len(a) // WINDOW for a in batch) / per_call),
            "call_ms_p50": round(per_call * 1000, 2), "calls": len(lat)}


def with_threads(call: Call, threads: int) -> Call:
    def run(batch: list[np.ndarray]) -> list[np.ndarray]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return call(batch)
        finally:
            torch.set_num_threads(before)

    return run


def main(args: argparse.Namespace) -> dict[str, Any]:
    track = speech()
    onnx = SileroVAD()
    batched = silero_vad("cpu")
    cores = len(os.sched_getaffinity(0))
    configs: dict[str, Call] = {
        "onnxruntime_per_stream": lambda batch: [onnx.probabilities(a) for a in batch],
        "torch_batch_1_thread": with_threads(batched, 1),
        f"torch_batch_{cores}_threads": with_threads(batched, cores)}
    results: dict[str, dict[str, Any]] = {}
    load = [round(os.getloadavg()[0], 1)]
    for count in args.streams:
        batch = streams(track, count, args.windows)
        expected = [onnx.probabilities(a.copy()) for a in batch]
        got = batched([a.copy() for a in batch])
        diff = max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True))
        row: dict[str, Any] = {"windows": count * args.windows, "max_abs_diff": diff}
        for call in configs.values():
            call(batch[:1])  # warm
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        for r in range(args.rounds):  # configurations alternate, so each sees the same background load
            for name in list(configs) if r % 2 == 0 else list(reversed(configs)):
                rounds[name].append(timed(configs[name], batch, args.seconds))
        for name, rs in rounds.items():
            rate = [x["windows_per_s"] for x in rs]
            row[name] = {"windows_per_s": round(float(np.median(rate))), "min": min(rate), "max": max(rate),
                         "call_ms_p50": round(float(np.median([x["call_ms_p50"] for x in rs])), 2), "rounds": rs}
        row["speedup_torch_batch_1_thread_vs_onnxruntime"] = round(
            row["torch_batch_1_thread"]["windows_per_s"] / row["onnxruntime_per_stream"]["windows_per_s"], 2)
        print(f"{count} streams x {args.windows} windows: "
              + ", ".join(f"{k} {v['windows_per_s']} windows/s ({v['call_ms_p50']} ms/call)"
                          for k, v in row.items() if isinstance(v, dict))
              + f"; max |diff| {diff:.2e}", flush=True)
        results[str(count)] = row
        load.append(round(os.getloadavg()[0], 1))
    return {"schema": "linguafusion.bench.gpu_vad/1", "commit": git_commit(), "machine": machine(),
            "device": "cpu (not run on a GPU)", "load_average": load,  # 1-minute, before and after each stream count
            "config": {"windows_per_stream": args.windows, "seconds": args.seconds, "rounds": args.rounds,
                       "torch": torch.__version__, "cores": cores},
            "streams": results}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 512])
    a = ap.parse_args()
    a.json.parent.mkdir(parents=True, exist_ok=True)
    report = main(a)
    a.json.write_text(json.dumps(report, indent=1))
