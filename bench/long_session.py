"""Issue 32's long-session figure: one live stream of two hours on a real server over a real WebSocket, fed faster
than real time, and per 10-minute window of stream time the server's RSS, its CPU time and the caption latency;
first window against last.

    .venv/bin/python bench/long_session.py --minutes 120 --json bench/results/long_session.json

The talk (``lab/long_talk.py``): the 12 built-in English sentences spoken by Piper, in a seeded order, 0.8-2.5 s
apart, and a 30 s break every 5 minutes, into Spanish, partials on, class ``standard``. It is sent in 0.5 s binary
frames as fast as the stream's audio budget lets it (``ready``'s ``max_audio_speed``: 4x real time unless
``--speed`` raises it through ``LINGUAFUSION_LIMITS__MAX_AUDIO_SPEED``, a setting this benchmark uses and reports),
holding back while more than ``--max-pending-s`` of its speech is not captioned yet (the figures say how often:
0 means the server kept up). Settings the benchmark uses, all reported: the translation memory off
(``LINGUAFUSION_TM__ENABLED=false``: the talk repeats its sentences, and every caption should cost its MT), and
the stream log compacted every minute down to its last 500 finals (``LINGUAFUSION_STATE__COMPACT_INTERVAL_S=60``,
``LINGUAFUSION_STATE__MAX_LOG_FINALS=500``) so that the run crosses compactions.

RSS is the server process's (``/proc/PID/status`` VmRSS, what /metrics' ``process_resident_memory_bytes`` says;
the Apertium processes it starts are their own), sampled every 2 s; a window's figure is its last sample. Caption
latency is each final's ``latency_ms.caption`` (the server's: the utterance's last audio received -> its caption
sent), by the window its ``end`` falls in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def log_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.rglob("streams.sqlite3*"))


def window_rows(finals: list[dict[str, Any]], partials: list[float], samples: list[dict[str, float]],
                window_s: float, total_s: float) -> list[dict[str, Any]]:
    """Per window of stream time: finals (by their end), caption latency, partials shown (tentative decodes the
    scheduler did not shed: they cost CPU as the machine allows), the last RSS / CPU / log sample. The talk ends
    with the sentence that crosses ``total_s``: that tail belongs to the last window."""
    rows = []
    n = max(1, int(np.floor(total_s / window_s + 1e-6)))
    for k in range(n):
        a, b = k * window_s, (k + 1) * window_s if k < n - 1 else float("inf")
        lat = [f["caption_ms"] for f in finals if a <= f["end"] < b]
        inside = [s for s in samples if a <= s["stream_s"] < b] or [min(samples, key=lambda s: abs(s["stream_s"] - b))]
        last = inside[-1]
        wall = [s["wall_s"] for s in inside]
        rows.append({"window": k + 1, "stream_min": [round(a / 60, 1), round(min(b, total_s) / 60, 1)],
                     "finals": len(lat), "partials": sum(1 for t in partials if a <= t < b),
                     "caption_p50_ms": round(float(np.percentile(lat, 50)), 1) if lat else None,
                     "caption_p99_ms": round(float(np.percentile(lat, 99)), 1) if lat else None,
                     "caption_max_ms": round(max(lat), 1) if lat else None,
                     "rss_mib": round(last["rss"] / 2**20, 1), "rss_max_mib": round(max(s["rss"] for s in inside)
                                                                                    / 2**20, 1),
                     "cpu_s": round(last["cpu"] - (rows[-1]["_cpu"] if rows else samples[0]["cpu"]), 1),
                     "wall_s": round(max(wall) - min(wall), 1), "log_kib": round(last["log"] / 1024, 1),
                     "_cpu": last["cpu"]})
    for r in rows:
        r.pop("_cpu")
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from conftest import start_server, stop_server
    from websockets.asyncio.client import connect

    from lingua_fusion.lab.fixtures import builtin_sentences, git_commit, machine
    from lingua_fusion.lab.long_talk import FeedStats, feed, plan_talk, sentence_pcm

    sentences = [en for _i, en, _es in builtin_sentences()]
    pcms = sentence_pcm(sentences)
    total_s = args.minutes * 60
    plan = plan_talk([len(p) // 2 for p in pcms], total_s, seed=args.seed, break_every_s=args.break_every_s,
                     break_s=args.break_s)
    total_s = plan[-1].end / 16000
    env = {"LINGUAFUSION_LIMITS__MAX_AUDIO_SPEED": str(args.speed), "LINGUAFUSION_TM__ENABLED": "false",
           "LINGUAFUSION_STATE__COMPACT_INTERVAL_S": "60", "LINGUAFUSION_STATE__MAX_LOG_FINALS": "500"}
    state = Path(tempfile.mkdtemp(prefix="lf-long-"))
    url, server = start_server(state, "--no-auth", env=env)
    finals: list[dict[str, Any]] = []
    partials: list[float] = []  # each partial's (or revision's) end, stream s
    errors: list[dict[str, Any]] = []
    samples: list[dict[str, float]] = []
    stats = FeedStats()
    closed: dict[str, Any] = {}
    t_start = time.monotonic()

    def sample() -> None:
        samples.append({"stream_s": stats.sent_s, "wall_s": time.monotonic() - t_start, "rss": rss_bytes(server.pid),
                        "cpu": cpu_s(server.pid), "log": log_bytes(state)})

    try:
        sample()
        async with connect(url.replace("http", "ws") + "/v1/streams", max_size=16 * 2**20) as ws:
            await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"],
                                      "partials": True, "slo": "standard"}))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready", ready

            async def receive() -> None:
                async for raw in ws:
                    if isinstance(raw, bytes):
                        continue
                    ev = json.loads(raw)
                    if ev["type"] == "final":
                        finals.append({"seq": ev["seq"], "end": ev["end"], "caption_ms": ev["latency_ms"]["caption"],
                                       "held_ms": ev["latency_ms"].get("held", 0.0), "text": ev["source_text"]})
                    elif ev["type"] in ("partial", "revision"):
                        partials.append(float(ev["end"]))
                    elif ev["type"] == "error":
                        errors.append(ev)
                    elif ev["type"] == "closed":
                        closed.update(ev)
                        return

            async def sampler() -> None:
                while True:
                    await asyncio.sleep(2.0)
                    sample()

            async def send(pcm: bytes, _ts: float) -> None:
                await ws.send(pcm)

            reader = asyncio.create_task(receive())
            sampling = asyncio.create_task(sampler())
            await feed(plan, pcms, send, lambda: finals[-1]["end"] if finals else 0.0,
                       speed=float(ready["max_audio_speed"]), burst_s=float(ready["max_audio_burst_s"]),
                       chunk_s=0.5, max_pending_s=args.max_pending_s, stats=stats)
            await ws.send(json.dumps({"type": "end"}))
            await asyncio.wait_for(reader, timeout=300)
            sampling.cancel()
            sample()
    finally:
        stop_server(server)
    rows = window_rows(finals, partials, samples, args.window_min * 60, total_s)
    seqs = [f["seq"] for f in finals]
    return {"schema": "linguafusion.bench.long_session/1", "commit": git_commit(), "machine": machine(),
            "stream_min": round(total_s / 60, 1), "window_min": args.window_min,
            "wall_s": round(time.monotonic() - t_start, 1),
            "settings": {**env, "speed": args.speed, "chunk_s": 0.5, "max_pending_s": args.max_pending_s,
                         "partials": True, "slo": "standard", "targets": ["es"]},
            "talk": {"sentences": len(sentences), "seed": args.seed, "break_every_s": args.break_every_s,
                     "break_s": args.break_s, "speech_min": round(sum(p.n for p in plan if p.sentence >= 0)
                                                                  / 16000 / 60, 1)},
            "feed": {"chunks": stats.chunks, "held_back": stats.waits, "held_back_s": round(stats.waited_s, 1)},
            "finals": len(finals), "gap_free": seqs == list(range(1, len(seqs) + 1)),
            "errors": [{"code": e.get("code"), "message": e.get("message")} for e in errors],
            "closed": {k: v for k, v in closed.items() if k != "type"}, "windows": rows}


def report(rep: dict[str, Any]) -> str:
    """The table and the first-against-last line; a saved result prints again with ``--report FILE``."""
    head = (f"{'window (stream min)':>20} {'finals':>6} {'partials':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
            f"{'RSS MiB':>8} {'CPU s':>6} {'wall s':>7} {'log KiB':>8}")
    lines = [head]
    for r in rep["windows"]:
        a, b = r["stream_min"]
        lines.append(f"{f'{a:g}-{b:g}':>20} {r['finals']:>6} {r.get('partials', '-')!s:>8} "
                     f"{r['caption_p50_ms']!s:>8} {r['caption_p99_ms']!s:>8} {r['caption_max_ms']!s:>8} "
                     f"{r['rss_mib']:>8} {r['cpu_s']:>6} {r['wall_s']:>7} {r['log_kib']:>8}")
    # the last whole window (a result saved before the tail was folded in ends with a short one)
    full = [r for r in rep["windows"] if r["stream_min"][1] - r["stream_min"][0] >= rep.get("window_min", 10) - 1e-6]
    first, last = rep["windows"][0], (full or rep["windows"])[-1]
    lines.append(f"first vs last window: RSS {first['rss_mib']} -> {last['rss_mib']} MiB, caption p99 "
                 f"{first['caption_p99_ms']} -> {last['caption_p99_ms']} ms, CPU {first['cpu_s']} -> "
                 f"{last['cpu_s']} s; {rep['finals']} finals (gap-free: {rep['gap_free']}), {rep['stream_min']} min "
                 f"of stream in {rep['wall_s']} s; held back {rep['feed']['held_back']} times "
                 f"({rep['feed']['held_back_s']} s); errors {[e['code'] for e in rep['errors']]}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=120.0, help="stream minutes to send (default: two hours)")
    ap.add_argument("--window-min", type=float, default=10.0, help="window of stream time for the figures")
    ap.add_argument("--speed", type=float, default=4.0,
                    help="the server's max_audio_speed (x real time; 4 is the product's default)")
    ap.add_argument("--max-pending-s", type=float, default=30.0,
                    help="the talk holds back while more of its speech than this is not captioned yet")
    ap.add_argument("--break-every-s", type=float, default=300.0)
    ap.add_argument("--break-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/long_session.json")
    ap.add_argument("--report", type=Path, help="print a saved result again (nothing is run)")
    args = ap.parse_args()
    if args.report is not None:
        print(report(json.loads(args.report.read_text())))
        return 0
    rep = asyncio.run(run(args))
    print(report(rep))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rep, indent=2) + "\n")
    return 0 if rep["gap_free"] and rep["closed"] else 1


if __name__ == "__main__":
    sys.exit(main())
