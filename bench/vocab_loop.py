"""Does one client's large vocabulary body hold up other clients? Worst ``/healthz`` latency seen by a second
client while one request of the largest allowed size runs, before and after the fix, on one machine in one run.

Two servers are started one after the other: "before" runs the source of ``--before`` (a git revision, extracted
with ``git archive`` to a temporary directory), "after" this checkout's ``src``. Against each, in order:

- ``add_example``: ``POST /v1/vocabularies/{id}/examples`` with a valid 2,000-frame example (both hands and pose,
  about 2.9 MB);
- ``refused``: the same route with an 11,000-frame body just under the 16 MiB limit (refused 400: too many frames);
- ``recognise``: ``POST .../recognise`` with the 2,000-frame body;
- ``export``: ``GET .../export`` of the 3 examples taught so far;
- ``import``: ``POST /v1/vocabularies/import`` of a document just under 16 MiB (4 examples of 2,000 frames).

A poller thread sends ``GET /healthz`` back to back (its own connection) while each request runs; the figure is
the slowest answer. Prints a table and writes ``bench/results/vocab_loop.json``.

    .venv/bin/python bench/vocab_loop.py --before dda4d1f
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "linguafusion"
LIMIT = 16 * 1024 * 1024


def frames(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)

    def pts(k: int) -> list[list[float]]:
        return (0.3 + 0.4 * rng.random((k, 2))).round(5).tolist()

    return [{"t": round(i / 30, 4), "left_hand": pts(21), "right_hand": pts(21), "pose": pts(33), "lips": None}
            for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(src: Path, state: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         check=True, env=env).stdout.strip()
    port = free_port()
    proc = subprocess.Popen([str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--state-dir",
                             str(state), "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url, key
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not start")


def worst_healthz(url: str, request: Any) -> tuple[float, float, int, int]:
    """Run ``request()`` while polling /healthz; (worst healthz s, request s, request status, polls)."""
    stop = threading.Event()
    worst = [0.0, 0]

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                c.get("/healthz")
                worst[0] = max(worst[0], time.perf_counter() - t0)
                worst[1] += 1
                time.sleep(0.01)

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    status = request()
    took = time.perf_counter() - t0
    time.sleep(0.1)
    stop.set()
    th.join()
    return worst[0], took, status, int(worst[1])


def run(src: Path, bodies: dict[str, bytes]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, key = serve(src, Path(tmp))
        try:
            h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            with httpx.Client(base_url=url, headers=h, timeout=120) as c:
                vid = c.post("/v1/vocabularies", json={"name": "bench", "kind": "sign"}).json()["vocabulary_id"]
                for i in range(2):
                    assert c.post(f"/v1/vocabularies/{vid}/examples", content=bodies[f"warm{i}"]).status_code == 201
                cases = {
                    "add_example": lambda: c.post(f"/v1/vocabularies/{vid}/examples", content=bodies["example"]),
                    "refused": lambda: c.post(f"/v1/vocabularies/{vid}/examples", content=bodies["refused"]),
                    "recognise": lambda: c.post(f"/v1/vocabularies/{vid}/recognise", content=bodies["recognise"]),
                    "export": lambda: c.get(f"/v1/vocabularies/{vid}/export"),
                    "import": lambda: c.post("/v1/vocabularies/import", content=bodies["import"]),
                }
                out = {}
                for name, call in cases.items():
                    worst, took, status, polls = worst_healthz(url, lambda call=call: call().status_code)
                    out[name] = {"worst_healthz_s": round(worst, 3), "request_s": round(took, 3), "status": status,
                                 "healthz_polls": polls}
                    print(f"  {name:12s} status {status}  request {took:6.2f} s  worst /healthz {worst:6.3f} s",
                          flush=True)
                return out
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", default="dda4d1f", help="git revision of the 'before' server")
    ap.add_argument("--out", default=str(ROOT / "bench/results/vocab_loop.json"))
    args = ap.parse_args()
    ex = frames(2000, 1)
    big = frames(11000, 2)
    refused = json.dumps({"gloss": "big", "frames": big}).encode()
    while len(refused) > LIMIT:
        big = big[:-100]
        refused = json.dumps({"gloss": "big", "frames": big}).encode()
    imp_examples = [{"gloss": f"g{i}", "frames": frames(2000, 10 + i)} for i in range(6)]
    doc = {"format": "linguafusion-vocabulary/1", "name": "imp", "kind": "sign", "lang": "en", "examples": []}
    while len(json.dumps(doc)) < LIMIT - 4_000_000 and imp_examples:
        doc["examples"].append(imp_examples.pop())
    bodies = {"example": json.dumps({"gloss": "hello", "frames": ex}).encode(),
              "warm0": json.dumps({"gloss": "a", "frames": frames(2000, 3)}).encode(),
              "warm1": json.dumps({"gloss": "b", "frames": frames(2000, 4)}).encode(),
              "refused": refused, "recognise": json.dumps({"frames": ex}).encode(),
              "import": json.dumps(doc).encode()}
    sizes = {k: len(v) for k, v in bodies.items()}
    print("body bytes:", sizes, f"(refused: {len(big)} frames; import: {len(doc['examples'])} examples)")
    rev = subprocess.run(["git", "rev-parse", args.before], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as old:
        tar = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=BytesIO(tar)) as t:
            t.extractall(old, filter="data")
        print(f"before ({rev[:10]}):")
        before = run(Path(old) / "src", bodies)
    print("after (this checkout):")
    after = run(ROOT / "src", bodies)
    ratios = {k: round(before[k]["worst_healthz_s"] / max(after[k]["worst_healthz_s"], 1e-3), 1) for k in before}
    print("worst /healthz before / after:", ratios)
    result = {"command": "python bench/vocab_loop.py --before " + args.before, "before_rev": rev,
              "body_bytes": sizes, "cpu_count": os.cpu_count(), "before": before, "after": after,
              "ratio_worst_healthz": ratios}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
