"""Where the model processes' threads spend a loaded run: a summary of a py-spy raw profile.

Record with py-spy as the parent of the benchmark (so it may read every process the benchmark spawns), every
thread, idle ones included::

    py-spy record --subprocesses --idle --threads -r 50 -f raw -o spy.txt -- \\
        python3 bench/gpu_streams.py --json x.json --warmup 50 --parts multi --multi-streams 900 --seconds 25
    python3 bench/spy_summary.py spy.txt

A raw profile has no timestamps, so the start-up (imports, model builds) is told apart by its frames and left out;
a thread waiting for work (a condition, the selector, an idle pool thread) is idle. What is left is each thread's
busy samples, by what it was doing. A thread waiting for Python's lock is sampled at the Python line it is on, so it
counts as busy: the sum of the threads' busy samples over one process's run time says how much lock time its threads
asked for.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

IDLE_LEAVES = ("Condition.wait", "EpollSelector.select", "_worker (concurrent", "Event.wait")


@dataclass(frozen=True)
class Sample:
    process: str
    thread: str
    frames: tuple[str, ...]
    count: int


def parse(path: Path) -> list[Sample]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        process = re.findall(r"process (\d+):", stack)[-1]
        rest = stack[stack.find("thread (", stack.rfind("process ")):].split(";")  # cmdlines may hold ';'
        out.append(Sample(process, re.sub(r" ?\(\d+\)", "", rest[0]), tuple(rest[1:]), int(n)))
    return out


def runner_work(stack: str) -> str:
    if "_start" in stack:
        if "encode" in stack or "LogMel" in stack:
            return "start: encoder (host side of its operators)"
        if "add_memories" in stack or "GpuRunner._add" in stack:
            return "start: encoder output into the cross pool"
        if ".key" in stack:
            return "start: window key (hash of the audio)"
        return "start: other"
    if "step" in stack:
        return "step: waiting for the GPU" if "device_call.py" in stack and "wait" in stack else "step: other"
    return "runner: other"


def loop_work(stack: str) -> str:
    for part in ("codec", "scheduler", "executor", "model_process", "session", "shard", "journal", "policy"):
        if part in stack:
            return f"event loop: {part}"
    return "event loop: asyncio"


def classify(sample: Sample) -> str | None:
    """What a busy sample was doing; None for idle or start-up."""
    if not sample.frames or sample.frames[-1].startswith(IDLE_LEAVES):
        return None
    stack = ";".join(sample.frames)
    if "GpuRunner._loop" in stack:
        return runner_work(stack)
    if sample.thread.endswith("MainThread"):
        return loop_work(stack) if "asyncio/runners" in stack or "run_until_complete" in stack else None
    return "other thread"


def summarize(samples: list[Sample], marker: str) -> dict[str, Counter[str]]:
    """Busy samples by thread name and work, over the processes whose stacks contain ``marker``."""
    chosen = {s.process for s in samples if any(marker in f for f in s.frames)}
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for s in samples:
        what = classify(s) if s.process in chosen else None
        if what is not None:
            out[s.thread.removeprefix("thread : ").strip() or "(unnamed)"][what] += s.count
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", type=Path)
    ap.add_argument("--marker", default="_model_proc_main", help="a frame of the processes to summarize")
    args = ap.parse_args()
    for thread, work in sorted(summarize(parse(args.profile), args.marker).items(), key=lambda kv: -kv[1].total()):
        print(f"{thread}: {work.total()} busy samples")
        for what, n in work.most_common():
            print(f"  {n / work.total():6.1%} {n:7d}  {what}")


if __name__ == "__main__":
    main()
