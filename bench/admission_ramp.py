"""Admission of a fast ramp of streams onto a modelled GPU runner, through the real Executor: with and without the
runner's step timings, and with and without the late signal (issue 30).

    .venv/bin/python bench/admission_ramp.py --json bench/results/admission_ramp.json [--streams 100,300,900]
    .venv/bin/python bench/admission_ramp.py --arms timings,late --encode-ms 4,4 --streams 300,600 \
        --json bench/results/admission_ramp_late.json
    .venv/bin/python bench/admission_ramp.py --arms late,measured --encode-ms 4,4 --streams 900,900,900,450,450 \
        --json bench/results/admission_ramp_measured.json

Arms: ``slope`` (no step timings: the curve's slope), ``timings`` (step timings, the late signal off), ``late``
(step timings and the late signal, serving/late.py; streams counted at their declared rates) and ``measured`` (all
that, with streams counted at the committed work they were measured to ask, serving/rates.py: the product's
default). The modelled streams commit every third of their requests, 0.44 a second, where 0.3 is declared, as the
H100 product's streams committed 0.42. ``--encode-ms FIXED,PER_ITEM``: an
encoder start's cost; the H100 product measured 3-5 ms of its runner thread per started item (docs/benchmarks.md,
"The product server on an H100 with admission by step timings"), where the default model has 0.8.

On an H100 the product admitted 32 of 600 and 47 of 1,200 streams ramped over 5 s, all within their SLO, while its
runner threads idled most of the time: admission drew the runner's latency curve past the few items a light load
held in flight along the slope through them, and a continuous batcher's latency does not grow with the items it
holds the way a serial runner's does. Now a GPU runner times its decode step at each batch size once its CUDA
graphs are captured, and admission scales its measured latency by that (serving/service_curve.py ``shape``).

No GPU here, so the runner is a model in a thread (``Batcher``): each item is one encoder start (a batch of up to 16
new items at a time, between decode steps, as serving/gpu/runner.py does) and STEPS decode steps, a step of n rows
taking ``GPU_STEP`` at n's bucket plus HOST_ROW_S a row. What it reports as its profile is ``GPU_STEP`` alone: the
encoder and the host's work per row are left for its measured latency to show, as the real runner's profile leaves
them. The executor, its scheduler and admission are the product's (serving/executor.py), on the machine's clock.
Streams are the interactive class (ASR budget 0.6 s, half of it to serve) and ask for ASR work as a live stream
does: a partial every PARTIAL_S and a committed utterance every third (stream_demand's declared rates).

Each row is a fresh executor: WARM streams for WARM_S (as bench/gpu_serve.py's warm-up), then ``n`` streams opened
over RAMP_S, each running DURATION_S; a stream refused at its open is gone. Printed and written to ``--json``:
per row and arm, streams admitted, committed items' p99 latency, streams whose every committed item was within the
ASR budget (goodput), partials shed, and the largest batch the runner stepped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from lingua_fusion.config import Settings
from lingua_fusion.errors import Overloaded
from lingua_fusion.serving.demand import stream_demand
from lingua_fusion.serving.executor import Executor
from lingua_fusion.serving.keys import ModelKey
from lingua_fusion.serving.ports import AsrInput, AsrOutput, CallContext, stage_budget
from lingua_fusion.serving.service_curve import step_at

KEY = ModelKey.asr("en")
# a decode step's seconds on the modelled device by batch size: an H100's order of size (bench/results), four times
# slower, so that this machine's 2 cores can drive the modelled runner past its capacity
GPU_STEP = tuple((b, 4 * s) for b, s in ((8, 0.0012), (16, 0.0012), (32, 0.0013), (64, 0.0014), (128, 0.0016),
                                         (256, 0.0021), (512, 0.0035), (1024, 0.006)))
HOST_ROW_S = 8e-6  # the host's bookkeeping a row a step (bench/step_host.py: about 2 us on a fast core), x4
ENCODE_S = (0.004, 0.0008)  # an encoder start: fixed + per item, up to ENCODE_BATCH items at a time
ENCODE_BATCH = 16
STEPS = 12  # decode steps an item takes
PARTIAL_S, COMMIT_EVERY = 0.75, 3
WARM, WARM_S, RAMP_S, DURATION_S = 12, 8.0, 5.0, 15.0


class Batcher:
    """A modelled continuous batcher (serving/threads.py ContinuousRunner, BusyCounted, StepProfiled)."""

    def __init__(self, profiled: bool) -> None:
        self.profiled = profiled
        self._inbox: deque[Future[Any]] = deque()
        self._rows: list[list[Any]] = []  # [steps left, future]
        self._cv = threading.Condition()
        self._closed = False
        self.busy = 0.0
        self.widest = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def room(self) -> int:
        return 1 << 20

    def busy_s(self) -> float:
        return self.busy

    def step_profile(self) -> tuple[tuple[int, float], ...]:
        return GPU_STEP if self.profiled else ()

    def submit(self, payloads: list[Any], tentative: list[bool]) -> list[Future[Any]]:
        futures: list[Future[Any]] = [Future() for _ in payloads]
        with self._cv:
            self._inbox.extend(futures)
            self._cv.notify()
        return futures

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def _work(self, seconds: float) -> None:
        time.sleep(seconds)
        self.busy += seconds

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and not self._rows and not self._closed:
                    self._cv.wait(timeout=0.5)
                if self._closed:
                    return
                new = [self._inbox.popleft() for _ in range(min(ENCODE_BATCH, len(self._inbox)))]
            if new:
                self._work(ENCODE_S[0] + ENCODE_S[1] * len(new))
                self._rows += [[STEPS, f] for f in new]
            n = len(self._rows)
            self.widest = max(self.widest, n)
            self._work(step_at(GPU_STEP, n) + HOST_ROW_S * n)
            for row in self._rows:
                row[0] -= 1
            for _, fut in [r for r in self._rows if r[0] <= 0]:
                fut.set_result(AsrOutput("words", 0.9))
            self._rows = [r for r in self._rows if r[0] > 0]


async def stream(ex: Executor, name: str, seconds: float, out: dict[str, Any]) -> None:
    try:
        ex.admit(stream_demand(name, "interactive", "en", [], True, 0.5, ["audio"]))
    except Overloaded:
        out["refused"] += 1
        return
    out["admitted"] += 1
    clip = AsrInput(np.zeros(1600, np.float32))
    latencies: list[float] = []
    try:
        await asyncio.sleep(random.uniform(0, PARTIAL_S))
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            i += 1
            committed = i % COMMIT_EVERY == 0
            t = time.monotonic()
            try:
                got = await ex.run(KEY, clip, CallContext(stream_id=name, slo="interactive", tentative=not committed))
            except Overloaded:  # the model's queue is full: a caption lost, its stream not served in time
                out["failed"] += 1
                latencies.append(float("inf"))
            else:
                if committed:
                    latencies.append(time.monotonic() - t)
                elif got is None:
                    out["shed"] += 1
            await asyncio.sleep(max(0.0, PARTIAL_S - (time.monotonic() - t)))
    finally:
        ex.release(name)
    out["latencies"] += latencies
    budget = stage_budget("interactive", "asr")
    out["good"] += bool(latencies) and max(latencies) <= budget


async def row(n: int, arm: str) -> dict[str, Any]:
    runner = Batcher(arm != "slope")
    settings = Settings()
    settings.server.max_streams = 100_000  # admission by cost alone (bench/gpu_serve.py lifts it the same way)
    ex = Executor(None, settings, backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    if arm not in ("late", "measured"):  # the executor as it was before serving/late.py: nothing owed is ever late
        ex.owed.late = lambda *_args, **_kw: 0.0  # type: ignore[method-assign]
    if arm != "measured":  # ... and before serving/rates.py: streams counted at their declared rates
        ex.meter.submitted = lambda *_args, **_kw: None  # type: ignore[method-assign]
    try:
        warm = {"admitted": 0, "refused": 0, "shed": 0, "good": 0, "failed": 0, "latencies": []}
        await asyncio.gather(*(stream(ex, f"warm-{i}", WARM_S, warm) for i in range(WARM)))
        out: dict[str, Any] = {"admitted": 0, "refused": 0, "shed": 0, "good": 0, "failed": 0, "latencies": []}

        async def opened(i: int) -> None:
            await asyncio.sleep(RAMP_S * i / n)
            await stream(ex, f"s{i}", DURATION_S, out)
        await asyncio.gather(*(opened(i) for i in range(n)))
        lat = sorted(out.pop("latencies"))
        return {"offered": n, **out, "committed_items": len(lat),
                "committed_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3) if lat and lat[-1] < 1e9 else None,
                "widest_batch": runner.widest, "runner_busy_s": round(runner.busy, 1)}
    finally:
        await ex.close()
        runner.close()


def main() -> None:
    global ENCODE_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="100,300,900")
    ap.add_argument("--arms", default="slope,timings")
    ap.add_argument("--encode-ms", default=",".join(f"{1000 * x:g}" for x in ENCODE_S))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    fixed, per_item = (float(x) / 1000 for x in args.encode_ms.split(","))
    ENCODE_S = (fixed, per_item)
    random.seed(0)
    rows = []
    for n in map(int, args.streams.split(",")):
        for arm in args.arms.split(","):
            if arm not in ("slope", "timings", "late", "measured"):
                raise SystemExit(f"--arms: {arm} is none of slope, timings, late, measured")
            r = {"arm": arm, **asyncio.run(row(n, arm))}
            print(json.dumps(r), flush=True)
            rows.append(r)
    report = {"bench": "admission_ramp", "model": {"gpu_step_s": GPU_STEP, "host_row_s": HOST_ROW_S,
                                                   "encode_s": ENCODE_S, "steps": STEPS, "partial_s": PARTIAL_S},
              "ramp_s": RAMP_S, "duration_s": DURATION_S, "warm": [WARM, WARM_S], "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
