"""Figures for docs/reliability.md "Security" (issue 10), each the issue's own attack measured again.

- ``glossary``: a 5,000-term glossary over 40 segments: one pattern per term per segment (the old way, kept here
  as the baseline) against the compiled matcher (cold: compiling included; warm: cached).
- ``fairness``: against a live server (auth on, started here): key B's one-line caption alone, then while key A's
  stream floods 40 texts of 19,000 characters into the same MT worker (the issue: 0.31 s -> 5.79 s).
- ``loop``: /healthz latency while one stream sends 8 blank 6000x6000 PNGs and another a 3.8 MB PCM message.

    .venv/bin/python bench/hardening.py --json bench/results/hardening.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import random
import re
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def glossary_figures() -> dict[str, Any]:
    from lingua_fusion import glossary
    from lingua_fusion.glossary import Term, protect

    rng = random.Random(0)
    vocab = list(dict.fromkeys("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))
                               for _ in range(6000)))[:5000]
    terms = [Term(w, w.upper()) for w in vocab]
    segments = [" ".join(rng.choice(vocab) if rng.random() < 0.1 else "word" for _ in range(20)) + "."
                for _ in range(40)]

    def one_pattern_per_term(text: str) -> str:
        for t in sorted(terms, key=lambda t: -len(t.source)):
            pat = re.compile(r"(?<!\w)" + re.escape(t.source) + r"(?!\w)", re.IGNORECASE)
            if pat.search(text):
                text = pat.sub("[900]", text)
        return text

    t0 = time.perf_counter()
    for s in segments:
        one_pattern_per_term(s)
    before = time.perf_counter() - t0
    glossary._matcher.cache_clear()
    t0 = time.perf_counter()
    for s in segments:
        protect(s, terms)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in segments:
        protect(s, terms)
    warm = time.perf_counter() - t0
    return {"terms": len(terms), "segments": len(segments), "per_term_patterns_s": round(before, 3),
            "matcher_cold_s": round(cold, 3), "matcher_warm_s": round(warm, 4)}


async def fairness_figures(url: str, admin: str) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    def new_key(name: str) -> str:
        r = httpx.post(url + "/v1/keys", json={"name": name}, headers={"Authorization": f"Bearer {admin}"})
        return str(r.json()["api_key"])

    ws_url = url.replace("http", "ws") + "/v1/streams"
    start = {"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False, "inputs": ["text"],
             "slo": "interactive"}

    async def open_stream(key: str) -> Any:
        ws = await connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}, max_size=None)
        await ws.send(json.dumps(start))
        assert json.loads(await ws.recv())["type"] == "ready"
        return ws

    async def caption(ws: Any, ts: float) -> float:
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "text", "text": "Good morning, everyone.", "ts": ts}))
        while json.loads(await ws.recv())["type"] != "final":
            pass
        return time.perf_counter() - t0

    b = await open_stream(new_key("neighbour"))
    alone = [await caption(b, float(i)) for i in range(5)]
    a = await open_stream(new_key("flooder"))
    page = ("The bank opens at nine and the market closes at five in the evening. " * 300)[:19_000]

    async def drain(ws: Any) -> None:
        with contextlib.suppress(Exception):
            async for _ in ws:
                pass

    reader = asyncio.create_task(drain(a))
    for i in range(40):
        await a.send(json.dumps({"type": "text", "text": page, "ts": float(i)}))
    await asyncio.sleep(0.5)
    beside = [await caption(b, 10.0 + i) for i in range(5)]
    await a.close()
    await b.close()
    reader.cancel()
    return {"b_caption_alone_s": [round(x, 3) for x in alone],
            "b_caption_beside_flood_s": [round(x, 3) for x in beside],  # one after the other, the flood still queued
            "flood": "40 x 19,000 characters on key A, then B's 5 captions (slo interactive)"}


async def loop_figures(url: str, admin: str) -> dict[str, Any]:
    import numpy as np
    from PIL import Image
    from websockets.asyncio.client import connect

    buf = io.BytesIO()
    Image.new("RGB", (6000, 6000), "white").save(buf, format="PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    pcm = (np.random.default_rng(0).standard_normal(1_900_000) * 300).astype("<i2").tobytes()  # 3.8 MB
    ws_url = url.replace("http", "ws") + "/v1/streams"
    headers = {"Authorization": f"Bearer {admin}"}
    lat: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        async with httpx.AsyncClient() as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                await c.get(url + "/healthz")
                lat.append(time.perf_counter() - t0)
                await asyncio.sleep(0.05)

    prober = asyncio.create_task(probe())
    await asyncio.sleep(1.0)
    idle = list(lat)
    imgs = await connect(ws_url, additional_headers=headers, max_size=None)
    await imgs.send(json.dumps({"type": "start", "target_langs": ["es"], "inputs": ["image"], "partials": False}))
    await imgs.recv()
    for i in range(8):
        await imgs.send(json.dumps({"type": "image", "ts": float(i), "data": png}))
    audio = await connect(ws_url, additional_headers=headers, max_size=None)
    await audio.send(json.dumps({"type": "start", "target_langs": ["es"], "inputs": ["audio"], "partials": False}))
    await audio.recv()
    await audio.send(pcm)
    await asyncio.sleep(15.0)
    stop.set()
    await prober
    await imgs.close()
    await audio.close()
    busy = lat[len(idle):]
    return {"healthz_idle_p50_ms": round(1000 * statistics.median(idle), 1),
            "healthz_under_load_p50_ms": round(1000 * statistics.median(busy), 1),
            "healthz_under_load_max_ms": round(1000 * max(busy), 1), "probes": len(busy),
            "load": "8 blank 6000x6000 PNG messages on one stream, one 3.8 MB PCM message on another"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/hardening.json")
    ap.add_argument("--server-only", action="store_true", help="skip the glossary figures (e.g. on an older tree)")
    args = ap.parse_args()
    from conftest import BIN, start_server, stop_server

    out: dict[str, Any] = {} if args.server_only else {"glossary": glossary_figures()}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        admin = subprocess.run([str(BIN), "keys", "create", "--admin", "--state-dir", str(state)],
                               capture_output=True, text=True, check=True).stdout.strip()
        url, proc = start_server(state)
        try:
            out["fairness"] = asyncio.run(fairness_figures(url, admin))
            out["loop"] = asyncio.run(loop_figures(url, admin))
        finally:
            stop_server(proc)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
