"""Where a model process's GPU time goes: a torch.profiler window over a live process, and its summary.

``capture`` (called inside a model process of ``bench/gpu_streams.py --parts multi --trace-at N``) records every
CUDA kernel for a few seconds with the runners' ranges (``gpu.asr.start`` / ``gpu.asr.step`` / ``gpu.mt.*``, from
serving/gpu/runner.py) and writes the Chrome trace (gzip) and a summary with the runners' own counters over the
same window.
``summarize`` reads such a trace, here or there:

    .venv/bin/python bench/gpu_trace.py summarize trace.json.gz --json summary.json

Each kernel is put under the innermost range around the call that launched it (matched by the profiler's
correlation id), else under its CUDA stream. Busy time is the union of all kernels' intervals over the window:
the share of time at least one of this process's kernels ran (NVML's utilisation, the card's, counts every
process's).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import gzip
import json
import threading
import time
from pathlib import Path
from typing import Any


def capture(out_dir: Path, seconds: float, runners: dict[str, Any]) -> None:
    """Profile this process for ``seconds``; write ``trace.json.gz`` and ``summary.json`` (the
    runners' counters over the window and ``summarize``'s figures) under ``out_dir``."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    before = {name: dataclasses.asdict(r.load) for name, r in runners.items()}
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    t0 = time.monotonic()
    try:  # the runners' threads, not only this one (torch >= 2.6)
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        config = None
    with torch.profiler.profile(activities=activities, experimental_config=config) as prof:
        time.sleep(seconds)
    wall = time.monotonic() - t0
    after = {name: dataclasses.asdict(r.load) for name, r in runners.items()}
    delta = {name: {k: round(after[name][k] - before[name][k], 4) for k in after[name]} for name in after}
    raw = out_dir / "trace.json"
    prof.export_chrome_trace(str(raw))
    text = raw.read_bytes()
    raw.unlink()
    with gzip.open(out_dir / "trace.json.gz", "wb") as g:
        g.write(text)
    summary = {"window_s": round(wall, 3), "runners": delta, "kernels": summarize(json.loads(text))}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def capture_when(event: Any, out_dir: Path, seconds: float, runners: dict[str, Any]) -> threading.Thread:
    """A daemon thread that waits (an hour at most) for ``event``, then captures."""
    def run() -> None:
        if event.wait(3600):
            capture(out_dir, seconds, runners)

    t = threading.Thread(target=run, name="gpu-trace", daemon=True)
    t.start()
    return t


@dataclasses.dataclass
class Bucket:
    kernels: int = 0
    busy_us: float = 0.0
    names: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def summarize(trace: dict[str, Any], top: int = 6) -> dict[str, Any]:
    events = trace.get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ranges: dict[Any, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and "dur" in e:
            ranges[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    starts = {tid: [r[0] for r in sorted(rs)] for tid, rs in ranges.items()}
    for rs in ranges.values():
        rs.sort()

    def label(k: dict[str, Any]) -> str:
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is not None and launch["tid"] in ranges:
            rs, at = ranges[launch["tid"]], launch["ts"]
            i = bisect.bisect_right(starts[launch["tid"]], at)
            inner = [r for r in rs[max(0, i - 8): i] if r[0] <= at <= r[1]]
            if inner:
                return max(inner, key=lambda r: r[0])[2]
        return f"stream {k.get('args', {}).get('stream', '?')}"

    buckets: dict[str, Bucket] = collections.defaultdict(Bucket)
    for k in kernels:
        b = buckets[label(k)]
        b.kernels += 1
        b.busy_us += k["dur"]
        b.names[k["name"][:80]] += k["dur"]
    if not kernels:
        return {"kernels": 0}
    t0 = min(k["ts"] for k in kernels)
    t1 = max(k["ts"] + k["dur"] for k in kernels)
    window = t1 - t0
    busy = _union_us([(k["ts"], k["ts"] + k["dur"]) for k in kernels])
    return {"window_s": round(window / 1e6, 3), "kernels": len(kernels), "host_in_ranges": host_in_ranges(events),
            "gpu_busy_pct": round(100 * busy / window, 1),
            "kernel_time_pct_of_window": round(100 * sum(k["dur"] for k in kernels) / window, 1),
            "mean_kernel_us": round(sum(k["dur"] for k in kernels) / len(kernels), 1),
            "by_range": {name: {"kernels": b.kernels, "pct_of_window": round(100 * b.busy_us / window, 1),
                                "mean_kernel_us": round(b.busy_us / b.kernels, 1),
                                "top": {n: round(100 * us / b.busy_us, 1) for n, us in b.names.most_common(top)}}
                         for name, b in sorted(buckets.items(), key=lambda kv: -kv[1].busy_us)}}


def host_in_ranges(events: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """For each range name: its time on its thread, and the outermost operators inside it by time (what the
    thread did there, Python's lock held or not), with the time between them."""
    ops: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "cuda_runtime") and "dur" in e:
            ops[e["tid"]].append(e)
    for rs in ops.values():
        rs.sort(key=lambda e: (e["ts"], -e["dur"]))
    out: dict[str, Any] = {}
    for r in (e for e in events if e.get("cat") == "user_annotation" and "dur" in e):
        a, b = r["ts"], r["ts"] + r["dur"]
        entry = out.setdefault(r["name"], {"ranges": 0, "ms": 0.0, "ops_ms": 0.0, "by_op": collections.Counter(),
                                           "calls": collections.Counter()})
        entry["ranges"] += 1
        entry["ms"] += r["dur"] / 1000
        end = a
        for e in ops.get(r["tid"], []):
            if a <= e["ts"] < b and e["ts"] >= end:  # outermost: not inside the operator before it
                entry["by_op"][e["name"]] += e["dur"] / 1000
                entry["calls"][e["name"]] += 1
                entry["ops_ms"] += e["dur"] / 1000
                end = e["ts"] + e["dur"]
    return {name: {"ranges": v["ranges"], "ms": round(v["ms"], 1), "ops_ms": round(v["ops_ms"], 1),
                   "top_ops": {n: {"ms": round(ms, 1), "calls": v["calls"][n]}
                               for n, ms in v["by_op"].most_common(top)}}
            for name, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("trace", type=Path)
    s.add_argument("--json", type=Path)
    args = ap.parse_args()
    opener = gzip.open if args.trace.suffix == ".gz" else open
    with opener(args.trace, "rt") as f:  # type: ignore[operator]
        out = summarize(json.load(f))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
