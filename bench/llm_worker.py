"""What the LLM worker process costs: the same batches through llama.cpp in this process (GemmaLlama) and through
the supervised worker (GemmaMT: framed JSON over a pipe, one round trip per batch), alternating in one run, plus
what a crash costs (SIGKILL mid-batch -> the error -> the next answer from a new worker).

    .venv/bin/python bench/llm_worker.py --json bench/results/llm_worker.json

Figures are medians over --rounds of each batch size; the ratio is worker / in-process in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.errors import BackendFailed  # noqa: E402
from lingua_fusion.models.mt_llm import GemmaLlama, GemmaMT  # noqa: E402

SENTENCES = ["Good morning, everyone.", "The meeting starts at ten.", "Please send me the report before Friday.",
             "We will hire two engineers next month.", "Thank you all for your hard work.",
             "The new office will open in the spring.", "Sales in the north were strong.", "Questions are welcome."]


def timed(fn, *args):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    gguf = Settings().models.cache_dir / "gemma3-270m-q4_k_m.gguf"
    local, worker = GemmaLlama(gguf, threads=2), GemmaMT(gguf, threads=2)
    start_ms, _ = timed(worker.hello)
    round_trip_ms = statistics.median(timed(worker.hello)[0] for _ in range(50))  # the frames alone, no model
    print(f"round trip without model work (hello): {round_trip_ms:.2f} ms")
    rows = []
    for size in (1, 4, 8):
        batch = SENTENCES[:size]
        inproc, remote = [], []
        for _ in range(args.rounds):
            ms, a = timed(local.translate, batch, "en", "de")
            inproc.append(ms)
            ms, b = timed(worker.translate, batch, "en", "de")
            remote.append(ms)
            assert a == b, (a, b)  # the same model, the same answers
        row = {"batch": size, "in_process_ms": round(statistics.median(inproc), 1),
               "worker_ms": round(statistics.median(remote), 1)}
        row["added_ms"] = round(row["worker_ms"] - row["in_process_ms"], 1)
        row["ratio"] = round(row["worker_ms"] / row["in_process_ms"], 3)
        rows.append(row)
        print(f"batch {size}: in-process {row['in_process_ms']} ms, worker {row['worker_ms']} ms "
              f"(+{row['added_ms']} ms, x{row['ratio']})")
    # a crash mid-batch: the error's latency, then the first answer of the new worker
    pid = worker.worker.pid()
    assert pid is not None
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    t = time.perf_counter()
    try:
        worker.translate(SENTENCES, "en", "de")
        failed_after_ms = None
    except BackendFailed:
        failed_after_ms = round((time.perf_counter() - t) * 1000, 1)
    recover_ms, _ = timed(worker.translate, SENTENCES[:1], "en", "de")
    print(f"worker start {start_ms:.0f} ms; SIGKILL 300 ms into a batch: error after {failed_after_ms} ms, "
          f"the next batch of 1 (a new worker: load + translate) {recover_ms:.0f} ms")
    result = {"batches": rows, "worker_start_ms": round(start_ms, 1), "round_trip_ms": round(round_trip_ms, 3),
              "crash_error_after_ms": failed_after_ms,
              "recovery_batch1_ms": round(recover_ms, 1), "restarts": worker.health().restarts,
              "command": "python bench/llm_worker.py --json bench/results/llm_worker.json"}
    worker.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
