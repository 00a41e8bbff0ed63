"""Issue 32, "silence stays silent": what a live stream captions during minutes of non-speech, and how soon it
captions speech again after them, on a live server over a real WebSocket.

    .venv/bin/python bench/silence.py --json bench/results/silence.json [--minutes 10] [--kinds silence,room,...]
    .venv/bin/python bench/silence.py --server-src /tmp/before/src --json bench/results/silence_before.json

For each kind of non-speech (lab/nonspeech.py: a microphone's self-noise, a room, applause, music; made with sox
when it is installed), one stream (en -> es, standard class, partials on) hears a sentence, 1.5 s of quiet,
``--minutes`` of that kind, 1.5 s of quiet, another sentence and 1.5 s of quiet (lab/pauses.py). The client sends
at the stream's audio budget (4x real time unless ``--speed`` raises the server's ``limits.max_audio_speed``), so
ten minutes take 150 s.

Figures per kind: invented finals (finals with words during the non-speech) per 10 minutes, finals withheld there
(gated, empty, saying why), partials shown there (and whether any was at or above the stream's confidence floor),
and the resume latency: from the moment the last sample of the sentence after the pause was sent to the arrival of
its final, and the server's own caption latency for it (``latency_ms.caption``: from when its last word arrived).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
FLOOR = 0.4  # the stream's min_confidence (the start message's default)


def one(ws_url: str, kind: str, minutes: float) -> dict[str, Any]:
    from test_silence import AFTER, BEFORE, speech

    from lingua_fusion.lab import nonspeech
    from lingua_fusion.lab.pauses import Piece, drive

    sound = nonspeech.make(kind, minutes * 60)
    quiet = nonspeech.make("silence", 1.5).audio
    pieces = [Piece("speech", speech(BEFORE)), Piece("silence", quiet), Piece(kind, sound.audio),
              Piece("silence", quiet), Piece("speech", speech(AFTER)), Piece("silence", quiet)]
    t0 = time.monotonic()
    run = asyncio.run(drive(ws_url, pieces, {"source_lang": "en", "target_langs": ["es"], "slo": "standard",
                                             "partials": True}, guard_s=300))
    wall = time.monotonic() - t0
    span = run.spans[2]
    invented, withheld, shown = run.invented(span), run.withheld(span), run.shown(span)
    after = run.resumed(run.spans[4])
    return {"kind": kind, "made_by": sound.made_by, "dbfs": round(sound.dbfs, 1), "minutes": minutes,
            "wall_s": round(wall, 1), "invented": len(invented),
            "invented_per_10_min": round(len(invented) * 10 / minutes, 2),
            "invented_texts": [e["source_text"] for e in invented][:10],
            "withheld": len(withheld), "withheld_notes": sorted({str(e.get("note")) for e in withheld})[:5],
            "partials_shown": len(shown), "partials_at_or_above_floor": sum(e["confidence"] >= FLOOR for e in shown),
            "partial_texts": sorted({e["source_text"] for e in shown})[:10],
            "resume_s": None if after is None else round(after[1], 3),
            "resume_caption_ms": None if after is None else after[0]["latency_ms"].get("caption"),
            "resume_text": None if after is None else after[0]["text"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--kinds", default="silence,room,applause,music,singing")
    ap.add_argument("--speed", type=float, default=None, help="the server's limits.max_audio_speed (default 4)")
    ap.add_argument("--server-src", type=Path, default=None,
                    help="run the server from this src/ (an earlier commit's checkout: the figure before a change)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from conftest import start_server, stop_server

    from lingua_fusion.lab.fixtures import git_commit, machine

    env = {"LINGUAFUSION_LIMITS__MAX_AUDIO_SPEED": str(args.speed)} if args.speed else {}
    if args.server_src:
        env["PYTHONPATH"] = str(args.server_src.resolve())
    url, proc = start_server(Path(tempfile.mkdtemp()), "--no-auth", env=env)
    rows = []
    try:
        for kind in args.kinds.split(","):
            row = one(url.replace("http://", "ws://") + "/v1/streams", kind, args.minutes)
            rows.append(row)
            print(f"{kind:9} ({row['made_by']}, {row['dbfs']:.0f} dBFS): invented {row['invented_per_10_min']:g} "
                  f"/ 10 min, withheld {row['withheld']}, partials shown {row['partials_shown']} "
                  f"({row['partials_at_or_above_floor']} at or above {FLOOR}), resume {row['resume_s']} s "
                  f"(caption {row['resume_caption_ms']} ms): {row['resume_text']!r}; {row['wall_s']} s", flush=True)
            if row["invented_texts"]:
                print("   invented:", row["invented_texts"], flush=True)
    finally:
        stop_server(proc)
    report = {"rows": rows, "speed": args.speed or 4.0, "server_src": str(args.server_src or ROOT / "src"),
              "commit": git_commit(), "machine": machine()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
