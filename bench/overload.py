"""Issue 28's overload figure: a live server offered its capacity C and 3C streams (``linguafusion bench load
--streams C,3C --all``), before and after admission by measured cost, in the same run.

Each server is ``linguafusion serve`` as a user starts it (auth off, its embedded defaults), here with the
continuous engine on the CPU (``LINGUAFUSION_MODELS__ENGINE=continuous``) and ``--workers 2`` unless told
otherwise. "Before" is the server of an earlier commit (``--before REV``, checked out in a temporary git worktree
and run from it with this checkout's environment); "after" is this checkout. The servers run one after the other
(they would share the cores), each loaded at every count.

    .venv/bin/python bench/overload.py --before eb4be82 --streams 6,18 --json bench/results/overload.json
    .venv/bin/python bench/overload.py --before eb4be82 --streams 6,18 --serve-args "" --engine ""   # one process
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin" / "linguafusion"


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """``rev``'s source in a temporary git worktree, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="lf-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), rev], check=True,
                   timeout=120)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False,
                       timeout=120)


@contextlib.contextmanager
def server(src: Path, serve_args: list[str], engine: str) -> Iterator[str]:
    """``linguafusion serve`` from the package in ``src`` on a free port; its URL once /readyz answers 200."""
    env = {"PYTHONPATH": str(src / "src"), "LINGUAFUSION_MODELS__ENGINE": engine}
    with serving(serve_args, env, "lf-overload-") as (url, _pid):
        yield url


@contextlib.contextmanager
def serving(serve_args: list[str], env: dict[str, str], prefix: str) -> Iterator[tuple[str, int]]:
    """``linguafusion serve --no-auth`` with ``serve_args`` and ``env`` over this one's, on a free port, its state
    directory (and log) a new ``prefix`` one; its URL and pid once /readyz answers 200 (bench/shard_wire.py too)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix=prefix))
    print(f"server state and log: {state}", flush=True)
    log = open(state / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--no-auth",
                             "--state-dir", str(state), "--log-level", "warning", *serve_args],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
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


def load(url: str, counts: list[int], duration: float, warm: int) -> list[dict[str, Any]]:
    """``linguafusion bench load --all`` at each count, after ``warm`` streams that load the models and teach
    admission the costs (their run is not reported): a server's first streams pay for its cold start."""
    if warm:
        bench_load(url, [warm], min(duration, 15.0))
    return [summary(r) for r in bench_load(url, counts, duration)["runs"]]


def bench_load(url: str, counts: list[int], duration: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "load.json"
        subprocess.run([str(BIN), "bench", "load", "--url", url, "--streams", ",".join(map(str, counts)), "--all",
                        "--duration", str(duration), "--json", str(out)], check=True, timeout=60 * 60,
                       stdout=subprocess.DEVNULL)
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def summary(run: dict[str, Any]) -> dict[str, Any]:
    classes = run["classes"].values()
    return {"offered": run["streams"], "admitted": sum(c["admitted"] for c in classes),
            "within_slo": run["goodput_streams"],
            "p99_s": max((c["caption_latency_s"]["p99"] or 0.0) for c in classes),
            "errors": sum(c["errors"] for c in classes), "cores_busy": run["server"]["cpu_cores_used"],
            "rejected_codes": sorted({code for c in classes for code in c.get("rejected_codes", [])}),
            "rejected_reasons": {why: n for c in classes for why, n in c.get("rejected_reasons", {}).items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git revision whose server is 'before' ('none': this "
                    "checkout's only, e.g. at its own measured capacity)")
    ap.add_argument("--streams", default="6,18", help="C,3C")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warm", type=int, default=2, help="streams run first to warm each server (not reported)")
    ap.add_argument("--serve-args", default="--workers 2")
    ap.add_argument("--engine", default="continuous", help="LINGUAFUSION_MODELS__ENGINE ('' for the default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    serve_args = shlex.split(args.serve_args)
    report: dict[str, Any] = {"bench": "overload", "serve": ["serve", *serve_args], "engine": args.engine,
                              "duration_s": args.duration, "streams": counts, "before_rev": args.before}
    with contextlib.ExitStack() as stack:
        servers = [("after", ROOT)]
        if args.before != "none":
            servers.insert(0, ("before", stack.enter_context(checkout(args.before))))
        for name, src in servers:
            with server(src, serve_args, args.engine) as url:
                report[name] = load(url, counts, args.duration, args.warm)
            for row in report[name]:
                print(f"{name:6s} offered {row['offered']:3d}: admitted {row['admitted']:3d}, within SLO "
                      f"{row['within_slo']:3d}, p99 {row['p99_s']} s, cores {row['cores_busy']}, refused "
                      f"{row['rejected_reasons']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
