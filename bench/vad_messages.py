"""What a stream's VAD costs a sharded server's model process, with VAD there and in the workers
(``models.vad_in_workers``): N live streams of quiet room noise (so VAD runs and nothing else: no speech, no ASR, no
MT), sent at real time over real WebSockets to ``linguafusion serve --workers 2``, one server after the other (the
ABBA order over ``--rounds``), and each process's CPU from /proc over the run.

    .venv/bin/python bench/vad_messages.py --streams 40 --duration 30 --json bench/results/vad_messages.json

Every 250 ms each stream sends its audio and the server asks VAD about it: in the model process, that is a request
and a reply across the process boundary, decoded on the event loop that the GPU engine's runner threads share a lock
with. Printed and written: per server and round, the cores each process used, and the model process's and the
workers' milliseconds of CPU per stream-second.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sharding import process_cpu, split, start, stop  # noqa: E402

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.sdk.client import ws_url  # noqa: E402
from lingua_fusion.sdk.stream import RemoteStream, start_message  # noqa: E402

CHUNK = 16000 * 2 // 4  # 250 ms of 16-bit PCM


async def quiet_stream(url: str, duration: float, seed: int) -> bool:
    """One stream of room noise at -60 dBFS for ``duration`` seconds; True if admitted and ended cleanly."""
    noise = (np.random.default_rng(seed).normal(0, 0.001, 16000 * 4) * 32767).astype("<i2").tobytes()
    stream = RemoteStream(ws_url(url), None, start_message(["es"], "en", "standard", True, 0.5, None, False, 0.4),
                          reconnect_timeout=duration + 60)
    await stream.__aenter__()
    try:
        t0 = time.monotonic()
        for k in range(int(duration * 4)):
            await asyncio.sleep(max(0.0, t0 + k * 0.25 - time.monotonic()))
            a = (k * CHUNK) % (len(noise) - CHUNK)
            await stream.send_audio(noise[a:a + CHUNK], k * 0.25)
        await stream.end()
        async for _ in stream:  # until closed
            pass
        return True
    finally:
        await stream.__aexit__(None, None, None)


async def load(url: str, n: int, duration: float) -> int:
    async def one(i: int) -> bool:
        await asyncio.sleep(i * 0.05)  # opens spread over n / 20 s
        return await quiet_stream(url, duration, i)
    done = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True),
                                  timeout=duration + 180)
    return sum(d is True for d in done)


def measure(name: str, in_workers: bool, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(dir=tmp))
    # auth off: one key opens them all; admission still reserves each its ASR (on 2 cores it takes about 16)
    env = {"LINGUAFUSION_MODELS__VAD_IN_WORKERS": "true" if in_workers else "false",
           "LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": str(args.streams + 8)}
    proc = start(args.port, state, "--workers", "2", env_extra=env)
    server = {"proc": proc, "state": state}
    try:
        url = f"http://127.0.0.1:{args.port}"
        asyncio.run(load(url, 2, 5.0))  # warm: the VAD's first call loads it
        before, t0 = process_cpu(server), time.monotonic()
        ok = asyncio.run(load(url, args.streams, args.duration))
        wall = time.monotonic() - t0
        cores = split(before, process_cpu(server), wall)
    finally:
        stop(proc)
    stream_s = ok * args.duration
    workers = sum(v for k, v in cores.items() if k.startswith("worker"))
    row = {"server": name, "vad_in_workers": in_workers, "streams": args.streams, "ended_cleanly": ok,
           "wall_s": round(wall, 1), "cores_by_process": cores,
           "model_ms_per_stream_s": round(1000 * cores.get("model", 0.0) * wall / stream_s, 3) if stream_s else None,
           "workers_ms_per_stream_s": round(1000 * workers * wall / stream_s, 3) if stream_s else None}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=40)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=18860)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = [("workers", True), ("model", False)]
            for name, in_workers in (order if r % 2 == 0 else order[::-1]):  # ABBA
                rows.append(measure(name, in_workers, args, tmp))
    report = {"bench": "vad_messages", "commit": git_commit(), "machine": machine(), "streams": args.streams,
              "duration_s": args.duration, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
