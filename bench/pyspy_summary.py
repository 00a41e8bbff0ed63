"""Where a process's busy time went, from py-spy's collapsed stacks (``bench/gpu_serve.py --profile-s``): per thread,
its share of the samples, then the functions holding the most of them (inclusive: the function or anything it
called) and the lines spending the most (self: the innermost frame).

    .venv/bin/python bench/pyspy_summary.py OUT/arm_plain_prof_2700_model.txt [--top 25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def frame_name(frame: str, *, with_line: bool) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    where = m["file"].split("site-packages/")[-1]
    return f"{m['func']} ({where}:{m['line']})" if with_line and m["line"] else f"{m['func']} ({where})"


def summarise(path: Path, top: int) -> dict[str, object]:
    threads: dict[str, Counter[str]] = defaultdict(Counter)
    selfs: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for raw in path.read_text().splitlines():
        stack, _, count = raw.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]  # "thread (TID): NAME" -> NAME
        n = int(count)
        totals[thread] += n
        for name in {frame_name(f, with_line=False) for f in frames[1:]}:  # once a stack, however deep it recurses
            threads[thread][name] += n
        if len(frames) > 1:
            selfs[thread][frame_name(frames[-1], with_line=True)] += n
    all_n = sum(totals.values())
    out: dict[str, object] = {"samples": all_n, "threads": {}}
    for thread, n in totals.most_common():
        out["threads"][thread] = {  # type: ignore[index]
            "samples": n, "share": round(n / all_n, 3),
            # what every sample of the thread shares (its bootstrap, the loop it runs) says nothing: left out
            "inclusive": dict([(k, round(v / n, 3)) for k, v in threads[thread].most_common() if v < 0.99 * n][:top]),
            "self": {k: round(v / n, 3) for k, v in selfs[thread].most_common(top)},
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=4, help="print this many of the busiest threads")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    doc = summarise(args.profile, args.top)
    print(f"{args.profile}: {doc['samples']} busy samples")
    for i, (thread, t) in enumerate(doc["threads"].items()):  # type: ignore[attr-defined]
        if i >= args.threads:
            break
        print(f"\n== {thread}: {t['samples']} samples ({t['share']:.0%})\n-- inclusive")
        for k, v in t["inclusive"].items():
            print(f"  {v:6.1%}  {k}")
        print("-- self")
        for k, v in t["self"].items():
            print(f"  {v:6.1%}  {k}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
