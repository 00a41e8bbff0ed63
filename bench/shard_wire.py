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
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

BIN = Path(sys.executable).with_name("linguafusion")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _role(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        return {"lf-worker": "worker", "lf-model-0": "model"}.get(name)
    return None


def _reading(pid: int) -> tuple[float, int]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"), int(io["wchar"])


def readings(supervisor: int) -> dict[int, tuple[str, float, int]]:
    out = {}
    for pid in _children(supervisor):
        role = _role(pid)
        if role is not None:
            with contextlib.suppress(OSError):
                out[pid] = (role, *_reading(pid))
    return out


@contextlib.contextmanager
def server(ring: bool) -> Iterator[tuple[str, int]]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix="lf-shard-wire-"))
    env = {**os.environ, "LINGUAFUSION_SERVER__SHM_RING": "true" if ring else "false"}
    log = open(state / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--no-auth",
                             "--state-dir", str(state), "--log-level", "warning", "--workers", "2",
                             "--model-processes", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError((state / "server.log").read_text())
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("the server was not ready in 180 s")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def load(url: str, streams: int, duration: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN), "bench", "load", "--url", url, "--streams", str(streams), "--duration",
                             str(duration), "--json", str(out)], stdout=subprocess.DEVNULL)


def run(ring: bool, streams: int, duration: float) -> dict[str, Any]:
    with server(ring) as (url, pid), tempfile.TemporaryDirectory() as tmp:
        load(url, 2, 10.0, Path(tmp) / "warm.json").wait(timeout=300)
        proc = load(url, streams, duration, Path(tmp) / "load.json")
        time.sleep(8.0)  # the streams open (Poisson over 5 s) and reach their first partials
        window = max(5.0, duration - 12.0)
        before = readings(pid)
        done = threading.Event()
        done.wait(window)
        after = readings(pid)
        proc.wait(timeout=duration + 300)
        report = json.loads((Path(tmp) / "load.json").read_text())["runs"][0]
    stream_s = streams * window
    by_role: dict[str, list[float]] = {"worker": [0.0, 0.0], "model": [0.0, 0.0]}
    for p, (role, cpu, wchar) in after.items():
        if p in before:  # a process that was replaced mid-window is left out, not counted negative
            by_role[role][0] += cpu - before[p][1]
            by_role[role][1] += wchar - before[p][2]
    classes = report["classes"].values()
    return {"arm": "ring" if ring else "socket", "streams": streams, "window_s": window,
            "cpu_ms_per_stream_s": {r: round(1e3 * v[0] / stream_s, 2) for r, v in by_role.items()},
            "worker_kb_written_per_stream_s": round(by_role["worker"][1] / 1024 / stream_s, 1),
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
