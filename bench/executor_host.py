"""The event loop's CPU per model item in a model process: the executor's path for a stream's ASR item on a
continuous runner (the GPU engine's), with the runner's own work taken away.

    .venv/bin/python bench/executor_host.py [--streams 100 --items 40 --rounds 5] [--json OUT.json]

On a GPU the model processes' host CPU is the limit (5.7 ms a stream-second on an H100 at 744 streams), and their
event loop shares Python's lock with the GPU runner threads: every microsecond the loop spends on an item is one a
runner thread may wait for. Here ``--streams`` admitted streams each send ``--items`` items through
``Executor.run`` (a partial, then a commit, in turn: the scheduler's queue, admission's meter, the hand-over, the
settling) to a runner whose thread answers every queued item at once, so nearly all the time left is the loop's.
Printed and written: the loop thread's CPU microseconds an item (``time.thread_time``), the least of ``--rounds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes import SerialRunner  # noqa: E402

from lingua_fusion.config import Settings  # noqa: E402
from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.serving.executor import Executor  # noqa: E402
from lingua_fusion.serving.keys import ModelKey  # noqa: E402
from lingua_fusion.serving.ports import AsrInput, CallContext  # noqa: E402
from lingua_fusion.serving.scheduler import Demand  # noqa: E402
from lingua_fusion.serving.service_curve import ProvenLoad  # noqa: E402

KEY = ModelKey.asr("en")


class Instant(SerialRunner):
    """A continuous runner whose thread answers everything queued at once, taking no time."""

    def _take(self) -> list[tuple[Any, Any]]:
        out = list(self._queue)
        self._queue.clear()
        return out

    def _seconds(self, n: int) -> float:
        return 0.0


async def one_round(streams: int, items: int) -> dict[str, float]:
    runner = Instant(per_item=0.0)
    executor = Executor(None, Settings(), backends={"asr": lambda _key: runner})  # type: ignore[arg-type]
    try:
        executor.scheduler.proven[KEY] = ProvenLoad(floor=100_000.0)  # admitted whatever the runner's prior says
        for s in range(streams):
            executor.admit(Demand(f"s{s}", "standard", {KEY: 0.5}))
        clip = AsrInput(np.zeros(16000, np.float32))

        async def stream(s: int) -> None:
            for i in range(items):
                ctx = CallContext(stream_id=f"s{s}", slo="standard", tentative=i % 2 == 0, key_id=f"k{s % 10}")
                await asyncio.wait_for(executor.run(KEY, clip, ctx), 30)

        await asyncio.wait_for(stream(0), 30)  # the runner made, its first items served
        t0, c0 = time.perf_counter(), time.thread_time()
        await asyncio.wait_for(asyncio.gather(*(stream(s) for s in range(streams))), 300)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
    finally:
        await executor.close()
    n = streams * items
    return {"items": n, "loop_cpu_us_per_item": round(1e6 * cpu / n, 1), "wall_us_per_item": round(1e6 * wall / n, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=100, help="within the queue's 256 items")
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rounds = [asyncio.run(one_round(args.streams, args.items)) for _ in range(args.rounds)]
    best = min(rounds, key=lambda r: r["loop_cpu_us_per_item"])
    print(f"{args.streams} streams x {args.items} items: the loop's CPU {best['loop_cpu_us_per_item']} us an item "
          f"(least of {args.rounds}; all: {[r['loop_cpu_us_per_item'] for r in rounds]})", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"bench": "executor_host", "commit": git_commit(), "machine": machine(),
                                         "streams": args.streams, "items": args.items, "rounds": rounds,
                                         "best": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
