"""SLO circuit breaker in a delay-fault experiment: time from fault to trip, and from clearing it to recovery.

    .venv/bin/python bench/breaker.py --json bench/results/breaker.json   (window 2 s, K = 2, MT delayed 3.5 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from conftest import start_server, stop_server

    from lingua_fusion import MultimodalTranslator

    url, proc = start_server(Path(tempfile.mkdtemp()), "--no-auth", "--chaos",
                             env={"LINGUAFUSION_SERVER__BREAKER_WINDOW_S": str(args.window),
                                  "LINGUAFUSION_SERVER__BREAKER_K": str(args.k)})
    marks: dict[str, float] = {}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            async with MultimodalTranslator(base_url=url).stream(["es"], slo="standard", partials=False) as s:
                await http.post("/v1/admin/faults", json={"model": "mt", "delay_s": args.delay})
                marks["fault_on"] = time.monotonic()

                async def send() -> None:
                    for _ in range(400):
                        await s.send_text("The house is very big.")
                        await asyncio.sleep(0.5)
                        if "degraded" in marks and "fault_off" not in marks:
                            await http.delete("/v1/admin/faults")
                            marks["fault_off"] = time.monotonic()
                        if "restored" in marks:
                            break
                    await s.end()

                sender = asyncio.create_task(send())
                async for ev in s:
                    if ev.type in ("degraded", "restored") and ev.type not in marks:
                        marks[ev.type] = time.monotonic()
                await sender
    finally:
        stop_server(proc)
    return {"schema": "linguafusion.bench.breaker/1", "window_s": args.window, "k": args.k,
            "mt_delay_s": args.delay, "target_p99_s": 3.0,
            "time_to_trip_s": round(marks["degraded"] - marks["fault_on"], 2),
            "time_to_recover_s": round(marks["restored"] - marks["fault_off"], 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--delay", type=float, default=3.5)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/breaker.json")
    args = ap.parse_args()
    rep = asyncio.run(run(args))
    text = json.dumps(rep, indent=2)
    print(text)
    args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
