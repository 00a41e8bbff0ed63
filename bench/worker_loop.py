"""What a `serve --workers` worker's event loop spends per stream-second, against an earlier commit's, in one run.

    .venv/bin/python bench/worker_loop.py --before HEAD~1 --streams 16 --rounds 3 --json bench/results/worker_loop.json

The workers' host CPU is a third of the product's on a GPU (3.3 of 9 ms a stream-second on an H100 at 744 streams);
its event loop runs every stream's messages and is one thread a worker. N live streams of quiet room noise
(bench/vad_messages.py: VAD runs and nothing else) against `linguafusion serve --workers 2`, from this tree and from
``--before REV`` (a temporary git worktree) in turn, A B B A over ``--rounds``. Each worker's threads are read from
/proc before and after: its main thread (the event loop) and the rest (VAD, the executor's threads). Printed and
written: per server and round, milliseconds of CPU per stream-second of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from overload import checkout  # noqa: E402
from sharding import start, stat_cpu, stop  # noqa: E402
from vad_messages import load  # noqa: E402

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402


def thread_cpu(pid: int) -> dict[int, tuple[bool, float]]:
    """Each thread of ``pid``: (whether it is the main thread, its CPU seconds; 0 for one that ended meanwhile)."""
    return {int(task.name): (int(task.name) == pid, stat_cpu(task / "stat"))
            for task in Path(f"/proc/{pid}/task").iterdir()}


def measure(name: str, src: Path, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(dir=tmp))
    env = {"PYTHONPATH": str(src / "src"), "LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": str(args.streams + 8)}
    proc = start(args.port, state, "--workers", "2", env_extra=env)
    try:
        url = f"http://127.0.0.1:{args.port}"
        asyncio.run(load(url, 2, 5.0))  # warm: the VAD's first call loads it
        workers = json.loads((state / "serve.json").read_text())["workers"]
        before = {w: thread_cpu(w) for w in workers}
        ok = asyncio.run(load(url, args.streams, args.duration))
        after = {w: thread_cpu(w) for w in workers}
    finally:
        stop(proc)
    main = rest = 0.0
    for w in workers:
        for tid, (is_main, cpu) in after[w].items():
            spent = max(0.0, cpu - before[w].get(tid, (is_main, 0.0))[1])  # (0 read: it ended as we looked)
            main, rest = (main + spent, rest) if is_main else (main, rest + spent)
    stream_s = ok * args.duration
    row = {"server": name, "streams": args.streams, "ended_cleanly": ok,
           "loop_ms_per_stream_s": round(1000 * main / stream_s, 3) if stream_s else None,
           "other_threads_ms_per_stream_s": round(1000 * rest / stream_s, 3) if stream_s else None}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the git revision whose server is 'before'")
    ap.add_argument("--streams", type=int, default=16, help="on 2 cores admission takes about 16 of them")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18880)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, checkout(args.before) as old:
        servers = [("before", old), ("after", ROOT)]
        for r in range(args.rounds):
            for name, src in servers if r % 2 == 0 else servers[::-1]:  # ABBA
                rows.append(measure(name, src, args, tmp))
    summary = {}
    for name, _ in servers:
        loops = [r["loop_ms_per_stream_s"] for r in rows if r["server"] == name and r["loop_ms_per_stream_s"]]
        summary[name] = round(sum(loops) / len(loops), 3) if loops else None
    print(f"event loop, ms of CPU a stream-second (mean of rounds): {summary}", flush=True)
    report = {"bench": "worker_loop", "commit": git_commit(), "before_rev": args.before, "machine": machine(),
              "streams": args.streams, "duration_s": args.duration, "rows": rows, "loop_mean": summary}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
