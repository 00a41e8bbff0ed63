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
        [--streams 4,8,12,14,16,20] [--baseline 2,3,4] [--duration 30] [--servers single=1,sharded=2]

``--servers`` names the servers compared, each ``name=WORKERS[xMODELS][/ASR_PARALLEL]``: ``--workers`` of ``serve``
(1: one process), ``--model-processes`` (default 1) and, when given, ``LINGUAFUSION_MODELS__ASR_PARALLEL`` (Whisper
batches run at once). For example ``--servers p1=1/1,p2=1/2,sharded-p2=2/2`` (load_knee_parallel.json) or
``--servers single=1,m2=2x2`` (two workers feeding two model processes: load_knee_model_processes.json); ``+VAR=VAL``
settings after a server's spec, for example ``--servers workers=2,model=2+MODELS__VAD_IN_WORKERS=false``
(vad_in_workers.json: where the streams' VAD runs). Every run
records the cores each server process used (``/proc``: the serving process, or the model processes and each worker,
and their child processes).

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


def start(port: int, state: Path, *extra: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(state / "server.log", "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env_extra or {})}
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


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of one live process, 0 when it is gone."""
    return stat_cpu(Path(f"/proc/{pid}/stat"))


def stat_cpu(stat: Path) -> float:
    """CPU seconds (user + system) in a /proc ``stat`` file, a process's or a thread's (``/proc/PID/task/TID``);
    0 when it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Apertium pipes, the sharded server's processes), from /proc/*/stat."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def process_cpu(server: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds so far of a server's processes: the serving process (one process), or the model process and
    each worker (``serve.json`` names them); ``other``: every other descendant of the launched process."""
    top = server["proc"].pid
    path = server["state"] / "serve.json"
    if path.exists():
        pids = json.loads(path.read_text())
        models = pids.get("models") or [pids["model"]]
        named = {"supervisor": top, **{("model" if j == 0 else f"model{j}"): p for j, p in enumerate(models)},
                 **{f"worker{i}": p for i, p in enumerate(pids["workers"])}}
    else:
        named = {"server": top}
    known = set(named.values()) | {top}
    out = {k: _cpu(p) for k, p in named.items()}
    out["other"] = sum(_cpu(p) for p in _children(top) if p not in known)
    return out


def split(before: dict[str, Any], after: dict[str, Any], wall: float) -> dict[str, Any]:
    """Cores each process of a server used during a run (a process that started mid-run counts from 0)."""
    # "other" sums live children only: one that ended mid-run takes its seconds with it (hence the floor at 0)
    return {k: max(0.0, round((after[k] - before.get(k, 0.0)) / wall, 2)) for k in after}


async def level(servers: dict[str, dict[str, Any]], n: int, order: tuple[str, ...], args: argparse.Namespace,
                baseline: bool = False) -> dict[str, dict[str, Any]]:
    """One offered load N on fresh servers: warm each (its first batches load the models), then measure each."""
    mix = load_mix(None)
    for name in order:
        await run_load(servers[name]["url"], None, mix, 2, 10, seed=99)
    out = {}
    for name in order:
        before = process_cpu(servers[name])
        load0, own0 = os.getloadavg()[0], time.process_time()
        r = await run_load(servers[name]["url"], None, mix, n, args.duration, seed=args.seed, baseline=baseline)
        r["load_average"] = round(os.getloadavg()[0], 1)
        r["load_average_start"] = round(load0, 1)
        r["loadgen_cores"] = round((time.process_time() - own0) / r["wall_s"], 2)
        cores = split(before, process_cpu(servers[name]), r["wall_s"])
        r["server"]["cores_by_process"] = cores
        r["server"]["cores_total"] = round(sum(cores.values()), 2)
        r["server_config"] = servers[name]["config"]
        label = "baseline" if baseline else name
        print(line(label, r), cores, "load", r["load_average_start"], "->", r["load_average"],
              "loadgen", r["loadgen_cores"], flush=True)
        out[label] = brief(r)
    return out


def fresh(args: argparse.Namespace, tmp: str, n: int, order: tuple[str, ...],
          baseline: bool = False) -> dict[str, dict[str, Any]]:
    """The servers started for this N only (no cost model learned at another load carries over), then stopped."""
    servers: dict[str, dict[str, Any]] = {}
    try:
        for k, name in enumerate(order):
            workers, models, parallel, sets = args.configs[name]
            state = Path(tempfile.mkdtemp(dir=tmp))
            extra = ("--workers", str(workers), "--model-processes", str(models)) if workers > 1 else ()
            env = {**({"LINGUAFUSION_MODELS__ASR_PARALLEL": str(parallel)} if parallel else {}), **sets}
            proc = start(args.port + k, state, *extra, env_extra=env)
            servers[name] = {"proc": proc, "state": state, "url": f"http://127.0.0.1:{args.port + k}",
                             "config": {"workers": workers, "model_processes": models, "asr_parallel": parallel,
                                        "env": sets}}
        return asyncio.run(level(servers, n, order, args, baseline))
    finally:
        for srv in servers.values():
            stop(srv["proc"])


def parse_servers(text: str) -> dict[str, tuple[int, int, int | None, dict[str, str]]]:
    """``single=1,sharded=2``, ``p1=1/1,p2=1/2``, ``m2=2x2`` or ``mp=2+MODELS__VAD_IN_WORKERS=false``: name ->
    (workers, model processes, asr_parallel or None for the default, settings as LINGUAFUSION_ variables)."""
    out: dict[str, tuple[int, int, int | None, dict[str, str]]] = {}
    for part in text.split(","):
        name, _, spec = part.partition("=")
        spec, *sets = spec.split("+")
        procs, _, parallel = spec.partition("/")
        workers, _, models = procs.partition("x")
        env = {f"LINGUAFUSION_{k}": v for k, _, v in (s.partition("=") for s in sets)}
        out[name.strip()] = (int(workers or 1), int(models or 1), int(parallel) if parallel else None, env)
    return out


def main(args: argparse.Namespace) -> dict[str, Any]:
    args.grid = [int(x) for x in args.streams.split(",")]
    args.base_grid = [int(x) for x in args.baseline.split(",")] if args.baseline else []
    args.configs = parse_servers(args.servers)
    names = tuple(args.configs)
    base_name = names[0]  # the per-stream baseline runs on the first server
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    runs["baseline"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(args.grid):
            # rotated (ABBA for two): each server first at some N, so none always sees the quietest machine
            order = names[i % len(names):] + names[:i % len(names)]
            for name, r in fresh(args, tmp, n, order).items():
                runs[name].append(r)
        for n in args.base_grid:
            runs["baseline"].append(fresh(args, tmp, n, (base_name,), baseline=True)["baseline"])
    loads = [r["load_average"] for rs in runs.values() for r in rs]
    out = {"schema": "linguafusion.bench.sharding/2", "commit": git_commit(), "machine": machine(),
           "note": "servers interleaved at each N (order rotated), fresh servers per N; load generator on the same "
                   "cores (loadgen_cores per run); load_average (1 min) at the start and end of each run",
           "config": {"streams": args.grid, "baseline": args.base_grid, "duration_s": args.duration,
                      "seed": args.seed, "servers": {k: {"workers": w, "model_processes": m, "asr_parallel": p,
                                                         "env": e} for k, (w, m, p, e) in args.configs.items()},
                      "mix": "default (en speech -> es, standard, partials, Poisson 5 s)"},
           "load_average_range": [min(loads), max(loads)] if loads else None,
           "knee_streams": {name: knee(rs) for name, rs in runs.items() if rs}, "runs": runs}
    k = out["knee_streams"]
    first = k.get(base_name)
    out["ratio_vs_first"] = {name: round(v / first, 2) if first else None for name, v in k.items()}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--streams", default="4,8,12,14,16,20")
    ap.add_argument("--baseline", default="2,3,4")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--servers", default="single=1,sharded=2",
                    help="name=WORKERS[/ASR_PARALLEL],...: the servers compared (the first also runs the baseline)")
    ap.add_argument("--port", type=int, default=18820)
    args = ap.parse_args()
    report = main(args)
    args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({"knee_streams": report["knee_streams"], "ratio": report["ratio_vs_first"],
                      "load_average_range": report["load_average_range"]}))
