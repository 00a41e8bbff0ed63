"""How `linguafusion serve --workers N` spreads live streams over its workers, and so over its model processes
(worker ``i`` feeds model process ``i % M``): real WebSockets opened against the server, then each worker's share.

    .venv/bin/python bench/accept_balance.py --workers 4 --streams 64 --json bench/results/accept_balance.json

Each arm is a fresh server with its settings as environment variables (``--arms``, NAME=VAR:VALUE,...; "-" for
none, as bench/arms.sh). Streams of text (no model work, so nothing but the accept decides where they land) are
opened ``--burst`` at a time and held; then the established connections each worker holds are counted from
/proc (its socket descriptors against /proc/net/tcp). Printed and written: per arm and round, the streams by
worker, and the busiest worker's count over the mean (1.0: even; N: all on one); and the same for ``--groups M``
model processes, as `--model-processes M` would get them (worker i's streams to model process i % M; the server here
runs one, since where a stream's model work goes does not change where it is accepted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sharding import start, stop  # noqa: E402

from lingua_fusion.lab.fixtures import git_commit, machine  # noqa: E402

START = {"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False, "inputs": ["text"]}
TCP_ESTABLISHED = "01"


def over_mean(counts: list[int]) -> float | None:
    mean = sum(counts) / len(counts)
    return round(max(counts) / mean, 2) if mean else None


def held_by_worker(port: int, workers: list[int]) -> dict[int, int]:
    """Established connections to ``port`` that each worker pid holds a descriptor of."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == TCP_ESTABLISHED:
                inodes.add(f[9])
    out = {}
    for pid in workers:
        n = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                n += os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes
            except OSError:  # closed while we looked
                continue
        out[pid] = n
    return out


async def hold(url: str, streams: int, burst: int) -> list[Any]:
    from websockets.asyncio.client import connect

    async def one() -> Any:
        ws = await connect(url, open_timeout=30, max_size=None)
        await ws.send(json.dumps(START))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if ready.get("type") != "ready":
            raise RuntimeError(f"not opened: {ready}")
        return ws

    held: list[Any] = []
    while len(held) < streams:
        held += await asyncio.gather(*(one() for _ in range(min(burst, streams - len(held)))))
    return held


async def close_all(held: list[Any]) -> None:
    await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)


def measure(name: str, envs: dict[str, str], args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(dir=tmp))
    env = {"LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": str(args.streams + 8),
           "LINGUAFUSION_SERVER__MAX_STREAMS": str(args.streams + 8), **envs}
    proc = start(args.port, state, "--workers", str(args.workers), env_extra=env)
    try:
        workers = json.loads((state / "serve.json").read_text())["workers"]

        async def run() -> dict[int, int]:
            held = await hold(f"ws://127.0.0.1:{args.port}/v1/streams", args.streams, args.burst)
            try:
                return held_by_worker(args.port, workers)
            finally:
                await close_all(held)

        by_worker = asyncio.run(asyncio.wait_for(run(), 300))
    finally:
        stop(proc)
    counts = [by_worker[pid] for pid in workers]  # in worker order: worker i at i
    groups = [sum(counts[i::args.groups]) for i in range(args.groups)]
    row = {"arm": name, "env": envs, "workers": args.workers, "streams": args.streams, "burst": args.burst,
           "by_worker": sorted(counts, reverse=True), "max_over_mean": over_mean(counts),
           "groups": args.groups, "by_group": sorted(groups, reverse=True), "group_max_over_mean": over_mean(groups)}
    print(json.dumps(row), flush=True)
    return row


def parse_arm(arm: str) -> tuple[str, dict[str, str]]:
    name, _, spec = arm.partition("=")
    if spec in ("", "-"):
        return name, {}
    return name, {f"LINGUAFUSION_{k}": v for k, v in (kv.split(":", 1) for kv in spec.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--burst", type=int, default=8, help="streams opened at once")
    ap.add_argument("--groups", type=int, default=1, help="model processes to sum the workers' streams over")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default="shared=SERVER__REUSE_PORT:false reuseport=-")
    ap.add_argument("--port", type=int, default=18870)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    arms = [parse_arm(a) for a in args.arms.split()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, envs in arms if r % 2 == 0 else arms[::-1]:  # ABBA
                rows.append(measure(name, envs, args, tmp))
    report = {"bench": "accept_balance", "commit": git_commit(), "machine": machine(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
