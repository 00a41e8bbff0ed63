"""What users create, shared in Redis (issue 31, docs/cluster.md): the figures, measured on real servers.

1. The cost of authentication per request: a key store in SQLite (the state directory) against one in Redis, in the
   same run: the store call alone (``authenticate``), and a whole request (``GET /v1/glossaries``: auth, the
   store's answer, JSON) on a server of each kind, interleaved round by round.
2. Revocation across gateways: two servers with separate state directories and one Redis; a key revoked through
   A; how long until B refuses its next request, and until B closes the key's live stream (the revoked-key watch,
   ``server.key_check_interval_s``).
3. The per-key stream cap under concurrent opens on two gateways: ``max_streams_per_key`` = 5, 20 streams opened
   at once, half on each; how many went live, round after round.

    .venv/bin/python bench/shared_state.py --json bench/results/shared_state.json [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

CAP = 5
OPENS = 20


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary_ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs) * 1000, 3), "p99_ms": round(pct(xs, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(xs) * 1000, 3)}


def store_calls(tmp: Path, url: str, n: int) -> dict[str, Any]:
    from lingua_fusion.state.redis_users import RedisUserStore
    from lingua_fusion.state.sqlite import SQLiteStore

    out: dict[str, Any] = {}
    stores = {"sqlite": SQLiteStore(tmp / "store"), "redis": RedisUserStore(url)}
    secrets = {name: s.create_key("bench")[0] for name, s in stores.items()}
    times: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(n):
        for name, s in stores.items():
            t = time.perf_counter()
            s.authenticate(secrets[name])
            times[name].append(time.perf_counter() - t)
    for name, s in stores.items():
        out[name] = summary_ms(times[name])
        s.close()
    out["redis_over_sqlite_p50"] = round(out["redis"]["p50_ms"] / out["sqlite"]["p50_ms"], 2)
    return out


def requests(servers: dict[str, tuple[str, str]], n: int) -> dict[str, Any]:
    import httpx

    times: dict[str, list[float]] = {name: [] for name in servers}
    clients = {name: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
               for name, (url, key) in servers.items()}
    for c in clients.values():  # warm each server's path once
        assert c.get("/v1/glossaries").status_code == 200
    for _ in range(n):
        for name, c in clients.items():
            t = time.perf_counter()
            r = c.get("/v1/glossaries")
            times[name].append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    for c in clients.values():
        c.close()
    out: dict[str, Any] = {name: summary_ms(xs) for name, xs in times.items()}
    out["redis_over_sqlite_p50"] = round(out["redis"]["p50_ms"] / out["sqlite"]["p50_ms"], 2)
    return out


def mint(url: str, admin: str) -> tuple[str, str]:
    import httpx

    r = httpx.post(url + "/v1/keys", json={"name": "bench"}, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    r.raise_for_status()
    return r.json()["api_key"], r.json()["key_id"]


async def revocation(a: str, b: str, admin: str, rounds: int) -> dict[str, Any]:
    import httpx
    from websockets.asyncio.client import connect

    refused, closed = [], []
    for _ in range(rounds):
        key, key_id = mint(a, admin)
        ws = await connect(b.replace("http", "ws", 1) + "/v1/streams",
                           additional_headers={"Authorization": f"Bearer {key}"})
        await ws.send(json.dumps({"type": "start", "inputs": ["text"], "source_lang": "en", "target_langs": ["es"]}))
        assert json.loads(await ws.recv())["type"] == "ready"
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.delete(a + f"/v1/keys/{key_id}", headers={"Authorization": f"Bearer {admin}"})
            r.raise_for_status()
            t0 = time.perf_counter()
            headers = {"Authorization": f"Bearer {key}"}
            while (await c.get(b + "/v1/glossaries", headers=headers)).status_code != 401:  # noqa: ASYNC110
                await asyncio.sleep(0.001)  # polling the other server is the measurement
            refused.append(time.perf_counter() - t0)
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 30)
        except Exception:  # the close (4401) ends the reads
            closed.append(time.perf_counter() - t0)
        await ws.close()
    return {"rounds": rounds, "next_request_refused_on_b": summary_ms(refused),
            "live_stream_closed_on_b": summary_ms(closed)}


async def quota(a: str, b: str, admin: str, rounds: int) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    live_per_round = []
    for _ in range(rounds):
        key, _ = mint(a, admin)

        async def one(url: str, key: str = key) -> Any:
            ws = await connect(url.replace("http", "ws", 1) + "/v1/streams",
                               additional_headers={"Authorization": f"Bearer {key}"})
            await ws.send(json.dumps({"type": "start", "inputs": ["text"], "source_lang": "en",
                                      "target_langs": ["es"]}))
            got = json.loads(await asyncio.wait_for(ws.recv(), 30))
            return ws, got["type"] == "ready"

        opened = await asyncio.gather(*(one(a if i % 2 else b) for i in range(OPENS)))
        live_per_round.append(sum(ok for _, ok in opened))
        for ws, _ in opened:
            await ws.close()
        await asyncio.sleep(0.5)  # the slots' releases reach Redis
    return {"cap": CAP, "opened_at_once": OPENS, "gateways": 2, "live_per_round": live_per_round,
            "exact": all(n == CAP for n in live_per_round)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    from conftest import BIN, start_server, stop_server

    from lingua_fusion.lab.chaos.redis_server import ManagedRedis

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        redis = ManagedRedis(tmp / "redis")  # everysec: the default a deployment would run
        redis.start()
        procs = []
        try:
            env = {"LINGUAFUSION_STATE__REDIS_URL": redis.url, "LINGUAFUSION_SERVER__KEY_CHECK_INTERVAL_S": "1",
                   "LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": str(CAP)}
            made = subprocess.run([str(BIN), "keys", "create", "--admin"], capture_output=True, text=True,
                                  env={**__import__("os").environ, **env}, timeout=60, check=True)
            admin = made.stdout.strip()
            for name in ("a", "b", "sqlite"):
                (tmp / name).mkdir()
            a, pa = start_server(tmp / "a", env=env)
            b, pb = start_server(tmp / "b", env=env)
            local, pl = start_server(tmp / "sqlite")
            procs = [pa, pb, pl]
            local_key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(tmp / "sqlite")],
                                       capture_output=True, text=True, timeout=60, check=True).stdout.strip()
            report = {
                "machine": f"{__import__('os').cpu_count()} cores",
                "store_call_authenticate": store_calls(tmp, redis.url, args.requests * 5),
                "request_get_glossaries": requests({"sqlite": (local, local_key),
                                                    "redis": (b, mint(a, admin)[0])}, args.requests),
                "revocation_across_gateways": asyncio.run(revocation(a, b, admin, args.rounds)),
                "stream_cap_two_gateways": asyncio.run(quota(a, b, admin, args.rounds)),
            }
        finally:
            for p in procs:
                stop_server(p)
            redis.stop()
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
