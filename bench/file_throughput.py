"""File requests on a live server (``linguafusion serve``, started here, as a user runs it): the latency of one
request at a time and the throughput of 8 at once, for a 30 s English talk -> Spanish text and for a paragraph of
text -> Spanish. Issue 28 asks that one request's latency stays within noise of before and that 8 at once gain
(files' model work now batches on the engine with everybody else's).

    .venv/bin/python bench/file_throughput.py --json bench/results/file_throughput.json
    PYTHONPATH=OTHER_CHECKOUT/src .venv/bin/python bench/file_throughput.py --json /tmp/before.json   # a baseline
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TEXT = ("Good morning everyone and welcome to the quarterly review. The new office will open in the spring. "
        "Please send me the report before Friday. We need more time to finish the project. The meeting starts at "
        "ten and ends at noon. Our team has grown by twelve people this year.")


_calls = iter(range(1_000_000))


async def one(client: httpx.AsyncClient, url: str, job: dict[str, Any]) -> float:
    if "text" in job.get("data", {}):  # a text of its own each time: the translation memory would answer a repeat
        job = {**job, "data": {**job["data"], "text": f"Item {next(_calls)}. {job['data']['text']}"}}
    t0 = time.monotonic()
    r = await client.post(url + "/v1/translate", timeout=600, **job)
    r.raise_for_status()
    return time.monotonic() - t0


async def measure(url: str, job: dict[str, Any], repeat: int, concurrent: int) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        await one(client, url, job)  # warm
        alone = [await one(client, url, job) for _ in range(repeat)]
        t0 = time.monotonic()
        await asyncio.gather(*(one(client, url, job) for _ in range(concurrent)))
        wall = time.monotonic() - t0
    return {"one_median_s": round(statistics.median(alone), 3), "one_min_s": round(min(alone), 3),
            f"at_{concurrent}_wall_s": round(wall, 2),
            f"at_{concurrent}_per_min": round(concurrent / wall * 60, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "file_throughput.json")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=8)
    args = ap.parse_args()
    from conftest import piper_wav, start_server, stop_server

    talk = piper_wav(TEXT)
    jobs = {"talk_30s_en_es": {"files": {"file": ("talk.wav", talk, "audio/wav")},
                               "data": {"target_lang": "es", "source_lang": "en"}},
            "text_en_es": {"data": {"text": TEXT, "source_lang": "en", "target_lang": "es"}}}
    state = Path(tempfile.mkdtemp(prefix="file-throughput-"))
    url, proc = start_server(state, "--no-auth")
    out: dict[str, Any] = {}
    try:
        for name, job in jobs.items():
            out[name] = asyncio.run(measure(url, job, args.repeat, args.concurrent))
            print(name, json.dumps(out[name]))
    finally:
        stop_server(proc)
    import lingua_fusion

    out["code"] = str(Path(lingua_fusion.__file__).parent)
    out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                   cwd=Path(lingua_fusion.__file__).parent, timeout=5).stdout.strip()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
