"""Issue 29's attacks on another key's captions, as figures: a live server (auth on, started here), key B's speech
streamed at real time, and how late B's captions come (end of speech -> final) alone and beside key A's attack:

- ``audio``: three streams of A sending back-to-back 30 s binary audio messages (the old attack sent 131 s ones,
  now refused; then B's socket closed 1011);
- ``images``: four streams of A sending a blank 6300x6300 PNG (40 MP) every 0.25 s;
- ``json``: the slowest /healthz beside four 16 MiB JSON bodies of plain lists to the vocabulary routes.

The same attacks are the tests of tests/service/test_fair_keys.py (with generous bounds); this prints and writes
the figures.

    .venv/bin/python bench/fair_keys.py --json bench/results/fair_keys.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _summary(late: list[float]) -> dict[str, float | int]:
    return {"captions": len(late), "median_s": round(statistics.median(late), 3) if late else -1.0,
            "max_s": round(max(late), 3) if late else -1.0}


async def figures(srv: Any) -> dict[str, Any]:
    from test_fair_keys import (
        blank_png,
        flood,
        healthz_while,
        honest_stream,
        image_flood,
        lists_body,
        speech_16k,
    )

    a, _ = srv.new_key("attacker")
    b, _ = srv.new_key("honest")
    audio = speech_16k()
    out: dict[str, Any] = {"alone": _summary(await honest_stream(srv, b, audio))}
    for name, attack in (("audio", lambda stop: [flood(srv, a, 30.0, stop, []) for _ in range(3)]),
                         ("images", lambda stop: [image_flood(srv, a, blank_png(6300), 0.25, stop, [])
                                                  for _ in range(4)])):
        stop = asyncio.Event()
        tasks = [asyncio.create_task(c) for c in attack(stop)]
        await asyncio.sleep(2.0)
        try:
            out[name] = _summary(await honest_stream(srv, b, audio))
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
    auth = {"Authorization": f"Bearer {a}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(srv.url + "/v1/vocabularies", headers=auth, content=b'{"kind": "sign"}')
        vid = r.json()["vocabulary_id"]
        body = lists_body(16 * (1 << 20) - 1024)
        posts = [client.post(f"{srv.url}/v1/vocabularies/{vid}/examples", headers=auth, content=body)
                 for _ in range(4)]
        answers, slowest = await healthz_while(srv, asyncio.gather(*posts))
    out["json"] = {"healthz_slowest_s": round(slowest, 3), "answers": [r.status_code for r in answers]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "fair_keys.json")
    args = ap.parse_args()
    from test_security import auth_server

    with auth_server(Path(tempfile.mkdtemp(prefix="fair-keys-"))) as srv:
        out = asyncio.run(figures(srv))
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
