"""The compressed-message flood of docs/reliability.md "Security": N streams each send 4 MiB messages of silence
(PCM zeros) for D seconds to a live server while /healthz is sampled every 0.1 s. With permessage-deflate
negotiated a 4 MiB message is about 4 KB on the wire and the server inflates it on its event loop; the server now
declines the extension, so the same client sends plain frames. Prints the figures and writes them as JSON.

    .venv/bin/python bench/ws_deflate_flood.py --url http://127.0.0.1:8000 --key sk_... --streams 8 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

MIB = 1024 * 1024


async def flood(ws_url: str, key: str, seconds: float) -> dict[str, Any]:
    sent, code = 0, None
    try:
        async with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}, max_size=None,
                           open_timeout=30) as ws:  # offers permessage-deflate, as browsers do
            await ws.send(json.dumps({"type": "start", "source_lang": "en", "target_langs": ["es"], "slo": "batch",
                                      "partials": False}))
            await asyncio.wait_for(ws.recv(), 30)
            compressed = bool(ws.protocol.extensions)
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                await ws.send(b"\0" * (4 * MIB))
                sent += 1
            await ws.send(json.dumps({"type": "end"}))
            async with asyncio.timeout(120):
                async for _ in ws:
                    pass
            code = ws.close_code
    except (ConnectionClosed, OSError, TimeoutError) as exc:
        return {"sent": sent, "close": repr(exc)[:80], "compressed": None}
    return {"sent": sent, "close": code, "compressed": compressed}


async def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    lat: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with httpx.AsyncClient() as c:
            while not done.is_set():
                t = time.perf_counter()
                await c.get(a.url + "/healthz", timeout=120)
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(0.1)

    prober = asyncio.create_task(probe())
    ws_url = a.url.replace("http", "ws", 1) + "/v1/streams"
    streams = await asyncio.gather(*(flood(ws_url, a.key, a.seconds) for _ in range(a.streams)))
    done.set()
    await prober
    out = {"streams": streams, "messages": sum(s["sent"] for s in streams), "healthz_n": len(lat),
           "healthz_median_ms": round(statistics.median(lat) * 1000, 1), "healthz_max_ms": round(max(lat) * 1000, 1)}
    print(json.dumps(out, indent=1))
    out["json"] = a.json
    return out


if __name__ == "__main__":
    figures = asyncio.run(main())
    if path := figures.pop("json"):
        Path(path).write_text(json.dumps(figures, indent=1))
