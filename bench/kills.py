"""Reliability figures: N live streams while the server is SIGKILLed and restarted K times (same port, same state
store), each client resuming by itself (SDK reconnect + write-ahead log). Counts committed captions lost and
duplicated, and the time from each restart to the next caption.

    .venv/bin/python bench/kills.py --streams 8 --kills 5 --json bench/results/kills.json [--redis URL]

``--text-streams N`` adds N streams that send the same sentences as text (one every 3 s, declared ``inputs:
["text"]``): a 2-core machine transcribes about a dozen live audio streams, so a 100-stream run is mostly text
streams, which still exercise the whole log / resume path at that concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from conftest import free_port, start_server, stop_server, talk_wav

    from lingua_fusion import MultimodalTranslator
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.lab.fixtures import builtin_sentences
    from lingua_fusion.media import decode_audio

    sentences = [en for _i, en, _es in builtin_sentences()]
    audio, _ = decode_audio(talk_wav(sentences), LimitSettings())
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    duration = len(pcm) / 32000
    env = {"LINGUAFUSION_STATE__REDIS_URL": args.redis} if args.redis else {}
    env["LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY"] = "1000"  # every stream comes from one anonymous client here
    state = Path(tempfile.mkdtemp())
    port = free_port()
    url, server = start_server(state, "--no-auth", env=env, port=port)
    restarts: list[float] = []
    finals: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    opened: list[int] = []
    all_open = asyncio.Event()

    async def stream(i: int) -> None:
        t = MultimodalTranslator(base_url=url)
        text_only = i >= args.streams
        s = t.stream(["es"], partials=False, slo="batch", inputs=["text"] if text_only else None)
        s._reconnect_timeout = 300
        await asyncio.sleep(0.05 * i)  # connections arrive over a few seconds, not in one burst
        async with s:
            opened.append(i)
            if len(opened) == args.streams + args.text_streams:
                all_open.set()
            t0 = time.monotonic()

            async def send() -> None:
                if text_only:
                    for k, sentence in enumerate(sentences):
                        delay = t0 + k * 3.0 - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await s.send_text(sentence, k * 3.0)
                    await s.end()
                    return
                chunk = 8000
                for k, off in enumerate(range(0, len(pcm), chunk)):
                    delay = t0 + k * 0.25 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await s.send_audio(pcm[off:off + chunk], k * 0.25)
                await s.end()

            sender = asyncio.create_task(send())
            async for ev in s:
                if ev.type == "final":
                    finals.setdefault(i, []).append((time.monotonic(), ev.model_dump()))
            await sender

    async def killer() -> None:
        nonlocal server
        rnd = random.Random(args.seed)
        await asyncio.wait_for(all_open.wait(), timeout=120)  # kills hit running streams, not their opening
        for _ in range(args.kills):
            await asyncio.sleep(rnd.uniform(2.0, max(2.5, duration / (args.kills + 1))))
            server.send_signal(signal.SIGKILL)
            await asyncio.to_thread(server.wait, 10)
            _url, server = await asyncio.to_thread(start_server, state, "--no-auth", env=env, port=port)
            restarts.append(time.monotonic())

    t_start = time.monotonic()
    total = args.streams + args.text_streams
    try:
        await asyncio.gather(killer(), *(stream(i) for i in range(total)))
    finally:
        stop_server(server)
    lost = dup = 0
    coverage = []
    per_stream: list[dict[str, Any]] = []
    import jiwer

    norm = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.Strip()])
    for i in range(total):
        seqs = [e["seq"] for _t, e in finals.get(i, [])]
        dup += len(seqs) - len(set(seqs))
        lost += (max(seqs) - len(set(seqs))) if seqs else 0
        text = " ".join(e["source_text"] for _t, e in finals.get(i, []))
        coverage.append(1 - jiwer.wer(norm(" ".join(sentences)), norm(text)))
        got = [e["source_text"] for _t, e in finals.get(i, [])]
        per_stream.append({"kind": "text" if i >= args.streams else "audio", "captions": len(seqs),
                           "coverage": round(coverage[-1], 3),
                           **({"missing": [k for k, x in enumerate(sentences) if x not in got],
                               "repeated": len(got) - len(set(got))} if i >= args.streams else {})})
    gaps = []
    for r in restarts:
        after = [t for fs in finals.values() for t, _e in fs if t > r]
        if after:
            gaps.append(min(after) - r)
    return {"schema": "linguafusion.bench.kills/1", "streams": total, "audio_streams": args.streams,
            "text_streams": args.text_streams, "kills": len(restarts),
            "store": "redis" if args.redis else "sqlite", "audio_s": round(duration, 1),
            "wall_s": round(time.monotonic() - t_start, 1),
            "captions": sum(len(v) for v in finals.values()), "seq_gaps_lost": lost, "duplicated": dup,
            "coverage_1_minus_wer": {"min": round(min(coverage), 3), "mean": round(float(np.mean(coverage)), 3)},
            "per_stream": per_stream,
            "restart_to_next_caption_s": {"p50": round(float(np.percentile(gaps, 50)), 2) if gaps else None,
                                          "p99": round(float(np.percentile(gaps, 99)), 2) if gaps else None,
                                          "max": round(max(gaps), 2) if gaps else None}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=8, help="audio streams")
    ap.add_argument("--text-streams", type=int, default=0, help="text-only streams on top of the audio ones")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--redis", default=os.environ.get("LINGUAFUSION_TEST_REDIS_URL"))
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/kills.json")
    args = ap.parse_args()
    rep = asyncio.run(main_async(args))
    text = json.dumps(rep, indent=2)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
