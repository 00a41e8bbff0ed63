"""Redis killed and restarted: how much acknowledged stream state is lost (the lost-state window).

Writers append finals to the stream log through the server's own RedisStreamStore (the WATCH/MULTI write the server
uses), as fast as one thread per stream can; at a random moment redis-server gets SIGKILL, is restarted on its
append-only file, and every stream's log is read back. A final counts as lost when its write was acknowledged before
the kill and is missing after the restart; the window is kill time minus the ack time of the oldest lost final.
Runs each ``appendfsync`` setting in the same process.

    .venv/bin/python bench/redis_kill.py --kills 5 --streams 8 --json bench/results/redis_kill.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.errors import LinguaFusionError  # noqa: E402
from lingua_fusion.lab.chaos.redis_server import ManagedRedis  # noqa: E402
from lingua_fusion.state.redis_streams import RedisStreamStore  # noqa: E402


def one_kill(appendfsync: str, streams: int, rng: random.Random) -> dict[str, Any]:
    redis = ManagedRedis(Path(tempfile.mkdtemp(prefix="lf-redis-kill-")), appendfsync=appendfsync)
    redis.start()
    acked: dict[str, list[tuple[int, float]]] = {}
    stop = threading.Event()
    try:
        def writer(sid: str) -> None:
            store = RedisStreamStore(redis.url, timeout_s=1.0)
            store.open_stream(sid, "tok", {"spec": {}})
            log = acked.setdefault(sid, [])
            seq = 0
            while not stop.is_set():
                seq += 1
                ev = {"type": "final", "seq": seq, "start": seq * 1.0, "end": seq + 0.9, "text": f"caption {seq}"}
                try:
                    store.append_final(sid, ev, ev["end"])
                except LinguaFusionError:
                    return  # Redis is gone: what was acknowledged so far is what we compare
                log.append((seq, time.monotonic()))
            store.close()

        threads = [threading.Thread(target=writer, args=(f"st_{i}",), daemon=True) for i in range(streams)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(2.0, 4.0))
        t_kill = time.monotonic()
        redis.kill()
        stop.set()
        for t in threads:
            t.join(timeout=10)
        t0 = time.monotonic()
        redis.start()
        restart_s = time.monotonic() - t0
        store = RedisStreamStore(redis.url)
        lost, window, total, consistent = 0, 0.0, 0, True
        for sid, log in acked.items():
            total += len(log)
            snap = store.resume(sid, "tok")
            kept = [int(e["seq"]) for e in store.finals_after(sid, 0)]
            consistent &= kept == list(range(1, len(kept) + 1)) and int(snap["last_seq"]) == len(kept)
            missing = [(s, t) for s, t in log if s > len(kept)]
            lost += len(missing)
            if missing:
                window = max(window, t_kill - missing[0][1])
        store.close()
        return {"appendfsync": appendfsync, "acknowledged": total, "lost": lost, "lost_window_s": round(window, 4),
                "log_consistent": consistent, "restart_s": round(restart_s, 3),
                "writes_per_s": round(total / max(1e-9, t_kill - min(log[0][1] for log in acked.values() if log)), 1)}
    finally:
        stop.set()
        redis.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--fsync", default="everysec,always,no")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    runs = []
    for mode in args.fsync.split(","):
        for k in range(args.kills):
            r = one_kill(mode, args.streams, rng)
            runs.append(r)
            print(f"appendfsync={mode:8s} kill {k + 1}: {r['acknowledged']:6d} acknowledged finals "
                  f"({r['writes_per_s']:.0f}/s), lost {r['lost']}, window {r['lost_window_s']} s, "
                  f"log consistent {r['log_consistent']}, restart {r['restart_s']} s", flush=True)
    summary = {mode: {"kills": sum(r["appendfsync"] == mode for r in runs),
                      "acknowledged": sum(r["acknowledged"] for r in runs if r["appendfsync"] == mode),
                      "lost": sum(r["lost"] for r in runs if r["appendfsync"] == mode),
                      "max_window_s": max(r["lost_window_s"] for r in runs if r["appendfsync"] == mode),
                      "all_consistent": all(r["log_consistent"] for r in runs if r["appendfsync"] == mode)}
               for mode in args.fsync.split(",")}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"bench": "redis_kill", "streams": args.streams, "runs": runs,
                                         "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
