"""What a stream costs the processes of ``serve --workers``: host CPU and bytes written per stream-second, with a
worker's large arrays through its shared-memory ring (serving/shard/shm.py) and through the socket (issue 30).

    .venv/bin/python bench/shard_wire.py --json bench/results/shard_wire.json [--streams 8] [--rounds 2]

Starts ``linguafusion serve --workers 2 --model-processes 1`` (the CPU engine's defaults) once per arm and round,
``server.shm_ring`` on and off, interleaved (on, off, off, on, ...: both see the same background load), warms it
with 2 streams, then runs ``linguafusion bench load`` (real WebSocket streams paced at real time, English speech ->
Spanish, partials on) and reads each server process's CPU seconds and bytes written (``/proc/PID/stat``,
``/proc/PID/io`` wchar: every write, the link's and the clients' alike) over the load's middle seconds. Printed and
written to ``--json``: per run, ms of CPU per stream-second by role (worker, model), KB written per stream-second by
the workers, and what the load reported (admitted, caption p99).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_serve import cpu_between, group_cpu_s
from overload import BIN, serving


def written(cpu: dict[int, tuple[str, float]]) -> dict[int, int]:
    """Bytes each worker of a ``group_cpu_s`` reading has written so far (/proc/PID/io wchar)."""
    out = {}
    for pid, (role, _cpu) in cpu.items():
        with contextlib.suppress(OSError):
            if role == "worker":
                io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
                out[pid] = int(io["wchar"])
    return out


def server(ring: bool) -> contextlib.AbstractContextManager[tuple[str, int]]:
    return serving(["--workers", "2", "--model-processes", "1"],
                   {"LINGUAFUSION_SERVER__SHM_RING": "true" if ring else "false"}, "lf-shard-wire-")


def load(url: str, streams: int, duration: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN), "bench", "load", "--url", url, "--streams", str(streams), "--duration",
                             str(duration), "--json", str(out)], stdout=subprocess.DEVNULL)


def run(ring: bool, streams: int, duration: float) -> dict[str, Any]:
    with server(ring) as (url, pid), tempfile.TemporaryDirectory() as tmp:
        load(url, 2, 10.0, Path(tmp) / "warm.json").wait(timeout=300)
        proc = load(url, streams, duration, Path(tmp) / "load.json")
        time.sleep(8.0)  # the streams open (Poisson over 5 s) and reach their first partials
        window = max(5.0, duration - 12.0)
        before = group_cpu_s(os.getpgid(pid))  # the server's processes by role (bench/gpu_serve.py)
        wrote = written(before)
        time.sleep(window)
        after = group_cpu_s(os.getpgid(pid))
        wrote = {p: n - wrote[p] for p, n in written(after).items() if p in wrote}
        proc.wait(timeout=duration + 300)
        report = json.loads((Path(tmp) / "load.json").read_text())["runs"][0]
    stream_s = streams * window
    cpu = cpu_between(before, after)
    classes = report["classes"].values()
    return {"arm": "ring" if ring else "socket", "streams": streams, "window_s": window,
            "cpu_ms_per_stream_s": {r: round(1e3 * cpu[r] / stream_s, 2) for r in ("worker", "model")},
            "worker_kb_written_per_stream_s": round(sum(wrote.values()) / 1024 / stream_s, 1),
            "admitted": sum(c["admitted"] for c in classes), "within_slo": report["goodput_streams"],
            "caption_p99_s": max((c["caption_latency_s"]["p99"] or 0.0) for c in classes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for r in range(args.rounds):
        for ring in ((True, False) if r % 2 == 0 else (False, True)):
            row = run(ring, args.streams, args.duration)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"bench": "shard_wire", "serve": "--workers 2 --model-processes 1",
                                         "duration_s": args.duration, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
