"""One 40 MP picture crossing from a stream worker's port to the model process (serving/shard/pictures.py), sent
whole (the RGB as decoded, 119 MB) and at the size OCR reads it (1984x1984, 11.8 MB): the OCR round trip, the
longest stall of the event loop, and the slowest MT call made beside it. The model process's server runs in this
process (tests/service/test_sharding.py ``_one_worker``), so one loop stands for both sides' loops.

    .venv/bin/python bench/picture_crossing.py --json bench/results/picture_crossing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


async def _beside(call: Callable[[], Awaitable[Any]], port: Any, ctx: Any) -> dict[str, float]:
    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import MtInput

    stop = asyncio.Event()
    gaps: list[float] = []
    mt: list[float] = []

    async def probe() -> None:
        t = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - t - 0.005)
            t = now

    async def translate() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await port.run(ModelKey.mt("en", "es"), MtInput("Good morning."), ctx("s2"))
            mt.append(time.monotonic() - t)

    tasks = [asyncio.create_task(probe()), asyncio.create_task(translate())]
    t = time.monotonic()
    await call()
    took = time.monotonic() - t
    stop.set()
    await asyncio.gather(*tasks)
    return {"ocr_round_trip_s": round(took, 3), "loop_stall_max_ms": round(max(gaps) * 1000, 1),
            "mt_beside_max_ms": round(max(mt) * 1000, 1)}


async def figures(rounds: int) -> dict[str, Any]:
    from test_sharding import _ctx, _one_worker

    from lingua_fusion.serving.keys import ModelKey
    from lingua_fusion.serving.ports import MtInput

    server, listener, link, port = await _one_worker(Path(tempfile.mkdtemp(prefix="crossing-")))
    blank = np.full((6300, 6300, 3), 255, dtype=np.uint8)
    try:
        await port.run(ModelKey.mt("en", "es"), MtInput("Good morning."), _ctx("s1"))  # models loaded first
        await port.run(ModelKey.ocr(), np.full((100, 100, 3), 255, np.uint8), _ctx("s1"))
        out: dict[str, Any] = {"picture": "6300x6300 RGB, blank"}
        for name, call in (("whole", lambda: port._run(ModelKey.ocr(), blank, _ctx("s1"))),
                           ("as_read", lambda: port.run(ModelKey.ocr(), blank, _ctx("s1")))):
            out[name] = [await _beside(call, port, _ctx) for _ in range(rounds)]
        return out
    finally:
        await link.close()
        listener.close()
        await server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "picture_crossing.json")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = asyncio.run(figures(args.rounds))
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
