"""Fuzz figures for the media decoders: mutated and truncated containers (the same mutations as the property
tests), counting executions, crashes (anything but a client error) and hangs (a decode over 5 s).

    .venv/bin/python bench/fuzz.py --runs 3000 --json bench/results/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/fuzz.json")
    args = ap.parse_args()
    from test_hostile_input import SEEDS, _decode, mutate

    from lingua_fusion.errors import ClientError, LinguaFusionError

    rnd = random.Random(args.seed)
    per_kind = {k: {"executions": 0, "accepted": 0, "client_errors": 0, "crashes": 0, "hangs": 0} for k in SEEDS}
    crashes: list[str] = []
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    slowest = 0.0
    t_start = time.monotonic()
    for _ in range(args.runs):
        kind = rnd.choice(sorted(SEEDS))
        flips = [(rnd.random(), rnd.randrange(256)) for _ in range(rnd.randrange(9))]
        data = mutate(SEEDS[kind], rnd.uniform(0.01, 1.0), flips)
        row = per_kind[kind]
        row["executions"] += 1
        t = time.monotonic()
        try:
            _decode(kind, data)
            row["accepted"] += 1
        except LinguaFusionError as exc:
            if isinstance(exc, ClientError):
                row["client_errors"] += 1
            else:
                row["crashes"] += 1
                crashes.append(f"{kind}: {exc!r}")
        except Exception as exc:  # the finding this benchmark exists for
            row["crashes"] += 1
            crashes.append(f"{kind}: {exc!r}")
        dt = time.monotonic() - t
        slowest = max(slowest, dt)
        if dt > 5.0:
            row["hangs"] += 1
    rep = {"schema": "linguafusion.bench.fuzz/1", "runs": args.runs, "seed": args.seed,
           "wall_s": round(time.monotonic() - t_start, 1), "per_container": per_kind,
           "crashes": sum(r["crashes"] for r in per_kind.values()), "hangs": sum(r["hangs"] for r in per_kind.values()),
           "slowest_decode_s": round(slowest, 3),
           "peak_rss_growth_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024, 1),
           "crash_samples": crashes[:10]}
    text = json.dumps(rep, indent=2)
    print(text)
    args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
