"""Rooms: how many listeners one machine serves for one live room in 4 languages with caption delivery p99
(final emitted by the publisher's stream -> received by the listener) <= 250 ms. Real WebSocket clients on
loopback, one server process (this checkout), listeners ramped up step by step in the same room.

    .venv/bin/python bench/rooms.py --steps 1,100,250,500,1000,1500 --json bench/results/rooms.json
    .venv/bin/python bench/rooms.py --gateways 2 --steps 1,100,250,500,1000 --json bench/results/rooms_2gw.json

``--gateways N`` runs N servers on one Redis (a real redis-server, the rooms' bus): the publisher on the first,
listeners spread over all of them in turn, so each event crosses Redis to the other gateways' followers.

The publisher is a text stream (a sentence every ``--interval`` s, as a speaker's captions come) published as a
room with its own target es; listeners ask for es, ca, fr and pt in turn, so the room computes 4 languages once
each. Each final carries ``published_at`` (the server's wall clock when the stream emitted it); a listener's
delivery time is its receive time minus that (same machine, same clock). The listener clients run in this process
on the same 2 cores as the server: the figure includes their cost, so it is pessimistic, not flattering. The
clients do not negotiate permessage-deflate (``compression=None``): with it, the server compresses every event
once per listener (each connection has its own zlib context), which costs more than the fan-out itself; a
browser does negotiate it, so a room of browsers costs more per listener than this figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
LANGS = ["es", "ca", "fr", "pt"]
SENTENCES = ["Good morning everyone and welcome to the conference.", "The river bank is green in the spring.",
             "Our new office opens next month in the city centre.", "Please send me the report before Friday.",
             "The results of the survey were better than expected.", "We will take a short break at eleven.",
             "Thank you all for coming here today.", "Questions are welcome at the end of the talk."]


class Listener:
    def __init__(self, i: int, lang: str) -> None:
        self.i, self.lang = i, lang
        self.delays: list[tuple[int, float]] = []  # (seq, seconds)
        self.last_seq = 0
        self.error: str | None = None
        self.gaps = 0

    async def run(self, ws_url: str, room_id: str, token: str, joined: asyncio.Event) -> None:
        from websockets.asyncio.client import connect

        try:
            async with connect(f"{ws_url}/v1/rooms/{room_id}/listen?targets={self.lang}",
                               additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=60,
                               max_queue=None, compression=None) as ws:
                joined.set()
                async for raw in ws:
                    now = time.time()
                    ev = json.loads(raw)
                    if ev["type"] == "final":
                        if self.last_seq and ev["seq"] != self.last_seq + 1:
                            self.gaps += 1
                        self.last_seq = ev["seq"]
                        self.delays.append((ev["seq"], now - ev["published_at"]))
                    elif ev["type"] == "error":
                        self.error = ev["code"]
                    elif ev["type"] == "closed":
                        return
        except Exception as exc:  # noqa: BLE001 - counted: a listener that could not join or was cut
            self.error = self.error or type(exc).__name__
            joined.set()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from conftest import free_port, start_server, stop_server
    from websockets.asyncio.client import connect

    from lingua_fusion.lab.fixtures import git_commit, machine

    env = {"LINGUAFUSION_SERVER__MAX_CONNECTIONS": "20000", "LINGUAFUSION_SERVER__MAX_STREAMS_PER_KEY": "100",
           "LINGUAFUSION_SERVER__STREAM_IDLE_TIMEOUT_S": "900"}
    redis = None
    if args.gateways > 1:
        from lingua_fusion.lab.chaos.redis_server import ManagedRedis

        redis = ManagedRedis(Path(tempfile.mkdtemp()))
        redis.start()
        env["LINGUAFUSION_STATE__REDIS_URL"] = redis.url
    started = [start_server(Path(tempfile.mkdtemp()), "--no-auth", env=env, port=free_port())
               for _ in range(args.gateways)]
    url, servers = started[0][0], [p for _, p in started]
    ws_url = url.replace("http://", "ws://")
    ws_urls = [u.replace("http://", "ws://") for u, _ in started]
    steps_out: list[dict[str, Any]] = []
    listeners: list[Listener] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        pub = await connect(ws_url + "/v1/streams", max_queue=None)
        await pub.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "inputs": ["text"],
                                   "partials": False, "room": True, "room_targets": ["ca", "fr", "pt"]}))
        ready = json.loads(await pub.recv())
        room_id, token = ready["room_id"], ready["listener_token"]
        pub_finals: list[dict[str, Any]] = []

        async def read_pub() -> None:
            async for raw in pub:
                ev = json.loads(raw)
                if ev["type"] == "final":
                    pub_finals.append(ev)

        reader = asyncio.create_task(read_pub())
        n_sent = 0
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for target in args.steps:
                while len(listeners) < target:  # ramp: join in bursts of 50
                    burst = []
                    for _ in range(min(50, target - len(listeners))):
                        lst = Listener(len(listeners), LANGS[len(listeners) % len(LANGS)])
                        joined = asyncio.Event()
                        listeners.append(lst)
                        gateway = ws_urls[lst.i % len(ws_urls)]  # spread over the gateways in turn
                        tasks.append(asyncio.create_task(lst.run(gateway, room_id, token, joined)))
                        burst.append(joined.wait())
                    await asyncio.wait_for(asyncio.gather(*burst), 120)
                await asyncio.sleep(args.settle)  # presence reaches the publisher: all 4 languages computed
                first = n_sent + 1
                for k in range(args.sentences):
                    await pub.send(json.dumps({"type": "text", "text": SENTENCES[k % len(SENTENCES)],
                                               "ts": float(n_sent)}))
                    n_sent += 1
                    await asyncio.sleep(args.interval)
                end = time.monotonic() + 60
                while time.monotonic() < end and any(  # noqa: ASYNC110 - polling many listeners' counters
                        lst.error is None and lst.last_seq < n_sent for lst in listeners):
                    await asyncio.sleep(0.1)
                delays = np.array([d for lst in listeners for s, d in lst.delays if s >= first]) * 1000
                alive = [lst for lst in listeners if lst.error is None]
                metrics = "\n".join([(await http.get(u + "/metrics")).text for u, _ in started])
                step = {"listeners": target, "connected": len(alive), "finals": n_sent - first + 1,
                        "deliveries": int(delays.size),
                        "expected_deliveries": len(alive) * (n_sent - first + 1),
                        "p50_ms": round(float(np.percentile(delays, 50)), 1) if delays.size else None,
                        "p99_ms": round(float(np.percentile(delays, 99)), 1) if delays.size else None,
                        "max_ms": round(float(delays.max()), 1) if delays.size else None,
                        "dropped": sum(1 for lst in listeners if lst.error), "gaps": sum(lst.gaps for lst in listeners),
                        "languages_translated": sorted((pub_finals[-1]["translations"] if pub_finals else {}).keys()),
                        "server_listeners_metric": _metric(metrics, "linguafusion_room_listeners"),
                        "listeners_per_gateway": [_metric((await http.get(u + "/metrics")).text,
                                                          "linguafusion_room_listeners") for u, _ in started]}
                steps_out.append(step)
                print(json.dumps(step), flush=True)
                if step["p99_ms"] is None or step["p99_ms"] > args.p99_ms * 4:
                    break  # far past the bound: the next step tells nothing new
        await pub.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(reader, 60)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    finally:
        for t in tasks:
            t.cancel()
        for server in servers:
            stop_server(server)
        if redis is not None:
            redis.stop()
    ok = [s for s in steps_out if s["p99_ms"] is not None and s["p99_ms"] <= args.p99_ms and not s["dropped"]
          and s["deliveries"] == s["expected_deliveries"]]
    return {"bench": "rooms", "gateways": args.gateways, "bound_p99_ms": args.p99_ms, "languages": LANGS,
            "interval_s": args.interval,
            "max_listeners_within_bound": max((s["listeners"] for s in ok), default=0), "steps": steps_out,
            "commit": git_commit(), "machine": machine()}


def _metric(text: str, name: str) -> float | None:
    """The sum of ``name``'s unlabelled samples in ``text`` (several servers' pages: their total)."""
    values = [float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return sum(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="1,100,250,500,1000,1500")
    ap.add_argument("--gateways", type=int, default=1, help="servers on one Redis; listeners spread over them")
    ap.add_argument("--sentences", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.5)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--p99-ms", type=float, default=250.0)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/rooms.json")
    args = ap.parse_args()
    args.steps = [int(x) for x in args.steps.split(",")]
    out = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"max listeners with delivery p99 <= {args.p99_ms:g} ms (none dropped, none missed): "
          f"{out['max_listeners_within_bound']}")


if __name__ == "__main__":
    main()
