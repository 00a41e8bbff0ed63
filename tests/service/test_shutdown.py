"""A server stopped (SIGTERM) while a long file translation runs answers it, 503 ``draining`` with Retry-After,
before it closes the connection: the client knows to send it again. Before, uvicorn cancelled the request at its
graceful-shutdown limit and the client read a bare 500 (an attack on a live server found it)."""

from __future__ import annotations

import contextlib
import io
import signal
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np
from conftest import start_server, talk_wav
from test_streaming import SENTENCES

LONG_S = 600.0  # of speech: far more work than the server's shutdown window (about 10 s) on any CPU we run on


def long_talk() -> bytes:
    with wave.open(io.BytesIO(talk_wav(SENTENCES))) as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    reps = int(LONG_S * rate / len(pcm)) + 1
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.tile(pcm, reps).tobytes())
    return out.getvalue()


def test_a_file_translation_running_at_shutdown_is_answered_draining_not_500(tmp_path: Path) -> None:
    url, proc = start_server(tmp_path, "--no-auth")
    answer: dict[str, httpx.Response | BaseException] = {}

    def post() -> None:
        try:
            answer["r"] = httpx.post(url + "/v1/translate", files={"file": ("talk.wav", long_talk(), "audio/wav")},
                                     data={"target_lang": "es", "source_lang": "en"}, timeout=120)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            answer["r"] = exc

    client = threading.Thread(target=post)
    client.start()
    try:
        for _ in range(600):  # until the request is being translated (its slot taken), 60 s at most
            page = httpx.get(url + "/metrics", timeout=10).text
            if any(line.startswith("linguafusion_requests_in_flight") and not line.endswith(" 0.0")
                   for line in page.splitlines()):
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        client.join(60)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    r = answer["r"]
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining", r.text
    assert r.headers["Retry-After"] == "2" and "again" in r.json()["error"]["message"]


async def test_room_listeners_are_told_to_listen_again_when_the_server_stops(tmp_path: Path) -> None:
    """SIGTERM with room listeners connected: each gets an ``error`` event ``draining`` (SSE, then its response
    ends; WebSocket, then close 1012) and can listen again with ``after_seq``. Before, SSE responses held the
    shutdown for uvicorn's whole 10 s and were then cut off with no event."""
    import asyncio
    import json

    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url, proc = start_server(tmp_path, "--no-auth")
    ws_url = url.replace("http", "ws")
    try:
        async with connect(ws_url + "/v1/streams") as pub:
            await pub.send(json.dumps({"type": "start", "target_langs": ["es"], "inputs": ["text"], "room": True}))
            ready = json.loads(await pub.recv())
            path = f"/v1/rooms/{ready['room_id']}"
            auth = {"Authorization": f"Bearer {ready['listener_token']}"}

            async def sse() -> list[str]:
                lines: list[str] = []
                async with httpx.AsyncClient(timeout=60) as c, c.stream("GET", f"{url}{path}/events?targets=es",
                                                                        headers=auth) as r:
                    async for line in r.aiter_lines():  # ends when the server ends the response
                        lines.append(line)
                return lines

            async def ws() -> tuple[list[dict[str, object]], int | None]:
                events: list[dict[str, object]] = []
                async with connect(f"{ws_url}{path}/listen?targets=es", additional_headers=auth) as listener:
                    with contextlib.suppress(ConnectionClosed):
                        async for m in listener:
                            events.append(json.loads(m))
                    return events, listener.close_code

            listening = [asyncio.create_task(sse()), asyncio.create_task(sse()), asyncio.create_task(ws())]
            for _ in range(300):  # until the three have joined (the rooms gauge), 30 s at most
                if "linguafusion_room_listeners 3.0" in httpx.get(url + "/metrics", timeout=10).text:
                    break
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            sse_a, sse_b, (ws_events, ws_code) = await asyncio.wait_for(asyncio.gather(*listening), 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for lines in (sse_a, sse_b):
        assert "event: error" in lines, lines
        data = json.loads(lines[lines.index("event: error") + 1].removeprefix("data: "))
        assert data["code"] == "draining" and "after_seq" in data["message"]
    assert ws_events[-1]["code"] == "draining" and ws_code == 1012
