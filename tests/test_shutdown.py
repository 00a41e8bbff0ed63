"""A server stopped (SIGTERM) while a long file translation runs answers it, 503 ``draining`` with Retry-After,
before it closes the connection: the client knows to send it again. Before, uvicorn cancelled the request at its
graceful-shutdown limit and the client read a bare 500 (an attack on a live server found it)."""

from __future__ import annotations

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
