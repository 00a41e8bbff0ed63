"""Issue 12, figure 4: the live-server knee with one process vs streams sharded over worker processes.

Starts two servers on this machine, ``linguafusion serve`` (one process) and ``linguafusion serve --workers 2``
(two stream workers and a model process), and runs the load generator (``linguafusion bench load``'s
``run_load``: real WebSocket streams paced at real time, the default mix: English speech -> Spanish, standard
class, partials on, Poisson arrivals over 5 s) against them INTERLEAVED: at each offered load N both servers one
after the other (ABBA: the other one first at the next N), so both see the same background load on a shared
machine. The per-stream baseline (admin ``engine: per-stream``) runs on the single-process server at the small N
it holds. The knee of each is the largest N of the grid that met the SLO with every smaller N meeting it too. For
the sharded server, each run also records the cores its model process and each worker used.

    .venv/bin/python bench/sharding.py --json bench/results/load_knee_sharding.json \
        [--streams 4,8,12,14,16,20] [--baseline 2,3,4] [--duration 30] [--workers 2]

The same knee from the command line, one server at a time (not interleaved):
    linguafusion serve --no-auth --port 8767 [--workers 2] &
    linguafusion bench load --url http://127.0.0.1:8767 --streams 2,4,8,12,16 --duration 30 --knee --baseline
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402
from lingua_fusion.lab.loadgen.mix import load_mix  # noqa: E402
from lingua_fusion.lab.loadgen.run import run_load  # noqa: E402

BIN = ROOT / ".venv" / "bin" / "linguafusion"


def start(port: int, state: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = open(state / "server.log", "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([str(BIN), "serve", "--no-auth", "--port", str(port), "--state-dir", str(state),
                             "--log-level", "warning", *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError((state / "server.log").read_text())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def knee(runs: list[dict[str, Any]]) -> int:
    best = 0
    for r in sorted(runs, key=lambda r: r["streams"]):
        if not r["meets_slo"]:
            break
        best = r["streams"]
    return best


def brief(r: dict[str, Any]) -> dict[str, Any]:
    """A run without its per-caption lists (the JSON stays readable)."""
    return {k: v for k, v in r.items() if k not in ("latencies", "streams_seen")}


def line(name: str, r: dict[str, Any]) -> str:
    c = r["classes"]["standard"]
    return (f"{name:>9} n={r['streams']:>2}: admitted {c['admitted']:>2}, rejected {c['rejected']}, p50/p99 "
            f"{c['caption_latency_s']['p50']}/{c['caption_latency_s']['p99']} s, cores {r['server']['cpu_cores_used']}"
            f", captions {r['server']['captions']}/{r['client_captions']}, meets {r['meets_slo']}")


def process_cpu(state: Path) -> dict[str, Any]:
    """CPU seconds so far of the sharded server's model process and of each worker (serve.json names them)."""
    pids = json.loads((state / "serve.json").read_text())

    def cpu(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    return {"model": cpu(pids["model"]), "workers": [cpu(p) for p in pids["workers"]]}


def split(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, Any]:
    """Cores each process of the sharded server used during a run."""
    return {"model": round((after["model"] - before["model"]) / wall, 2),
            "workers": [round((a - b) / wall, 2) for a, b in zip(after["workers"], before["workers"], strict=True)]}


async def level(urls: dict[str, str], n: int, order: tuple[str, ...], args: argparse.Namespace,
                baseline: bool = False) -> dict[str, dict[str, Any]]:
    """One offered load N on fresh servers: warm each (its first batches load the models), then measure each."""
    mix = load_mix(None)
    for name in order:
        await run_load(urls[name], None, mix, 2, 10, seed=99)
    out = {}
    for name in order:
        before = process_cpu(args.sharded_state) if name == "sharded" else None
        r = await run_load(urls[name], None, mix, n, args.duration, seed=args.seed, baseline=baseline)
        r["load_average"] = round(os.getloadavg()[0], 1)
        if before is not None:
            r["server"]["cores_by_process"] = split(before, process_cpu(args.sharded_state), r["wall_s"])
        label = "baseline" if baseline else name
        print(line(label, r), r["server"].get("cores_by_process", ""), "load", r["load_average"], flush=True)
        out[label] = brief(r)
    return out


def fresh(args: argparse.Namespace, tmp: str, n: int, order: tuple[str, ...],
          baseline: bool = False) -> dict[str, dict[str, Any]]:
    """Both servers started for this N only (no cost model learned at another load carries over), then stopped."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = {}
    try:
        for k, name in enumerate(order):
            state = Path(tempfile.mkdtemp(dir=tmp))
            extra = ("--workers", str(args.workers)) if name == "sharded" else ()
            if name == "sharded":
                args.sharded_state = state
            procs.append(start(args.port + k, state, *extra))
            urls[name] = f"http://127.0.0.1:{args.port + k}"
        return asyncio.run(level(urls, n, order, args, baseline))
    finally:
        for p in procs:
            stop(p)


def main(args: argparse.Namespace) -> dict[str, Any]:
    args.grid = [int(x) for x in args.streams.split(",")]
    args.base_grid = [int(x) for x in args.baseline.split(",")] if args.baseline else []
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "sharded": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(args.grid):
            order = ("single", "sharded") if i % 2 == 0 else ("sharded", "single")  # ABBA: neither always first
            for name, r in fresh(args, tmp, n, order).items():
                runs[name].append(r)
        for n in args.base_grid:
            runs["baseline"].append(fresh(args, tmp, n, ("single",), baseline=True)["baseline"])
    out = {"schema": "linguafusion.bench.sharding/1", "commit": git_commit(), "machine": machine(),
           "note": "one machine shared with other jobs (7 other engineers' tests; load_average per run): single "
                   "and sharded interleaved at each N (ABBA), fresh servers per N; load generator on the same 2 "
                   "cores",
           "config": {"streams": args.grid, "baseline": args.base_grid, "duration_s": args.duration,
                      "seed": args.seed, "workers": args.workers,
                      "mix": "default (en speech -> es, standard, partials, Poisson 5 s)"},
           "knee_streams": {name: knee(rs) for name, rs in runs.items()}, "runs": runs}
    k = out["knee_streams"]
    out["ratio_sharded_vs_single"] = round(k["sharded"] / k["single"], 2) if k["single"] else None
    out["ratio_sharded_vs_baseline"] = round(k["sharded"] / k["baseline"], 2) if k["baseline"] else None
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--streams", default="4,8,12,14,16,20")
    ap.add_argument("--baseline", default="2,3,4")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--port", type=int, default=18820)
    args = ap.parse_args()
    report = main(args)
    args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({"knee_streams": report["knee_streams"], "ratio": report["ratio_sharded_vs_single"]}))
