"""Issue 10, attack by attack, against real servers (`linguafusion serve` subprocesses; an in-loop uvicorn where the
test has to hold a model or a decoder still): each test makes the request the issue made and checks what a client
sees on the wire. Every wait has a bound; no assertion is about speed (bench/ has the figures)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import stat
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from conftest import BIN, encode_audio, free_port, read_until_closed, start_server, stop_server

from lingua_fusion.api import create_app
from lingua_fusion.config import Settings

MiB = 1 << 20
GUARD_S = 20.0  # how long a test waits for an answer that must come (a failure, not a figure, when it does not)


# ---- servers ---------------------------------------------------------------------------------------------------
class Srv:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], state: Path, admin: str | None = None) -> None:
        self.url, self.proc, self.state, self.admin = url, proc, state, admin
        self.port = int(url.rsplit(":", 1)[1])
        self.ws = f"ws://127.0.0.1:{self.port}/v1/streams"

    def log(self) -> str:
        return (self.state / f"server-{self.port}.log").read_text(errors="replace")

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin}"}

    def new_key(self, name: str) -> tuple[str, str]:
        r = httpx.post(self.url + "/v1/keys", json={"name": name}, headers=self.auth(), timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["api_key"], r.json()["key_id"]


def admin_key(state: Path) -> str:
    return subprocess.run([str(BIN), "keys", "create", "--admin", "--state-dir", str(state)], capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


@contextlib.contextmanager
def auth_server(state: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Srv]:
    """``linguafusion serve`` with auth on and an admin key made first (``extra``: its flags), stopped after."""
    admin = admin_key(state)
    url, proc = start_server(state, *extra, env=env)
    try:
        yield Srv(url, proc, state, admin)
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    """Auth on, a 1 MiB upload limit, a 2 s head timeout, one file translation at a time with two waiting, three
    glossaries per key; the access log on (info)."""
    state = tmp_path_factory.mktemp("guarded")
    os.chmod(state, 0o755)  # as an operator's directory might be: the server makes it private
    admin = admin_key(state)
    env = {"LINGUAFUSION_LIMITS__MAX_UPLOAD_BYTES": str(MiB), "LINGUAFUSION_SERVER__HEADER_TIMEOUT_S": "2",
           "LINGUAFUSION_SERVER__MAX_CONCURRENT_REQUESTS": "1", "LINGUAFUSION_SERVER__MAX_WAITING_REQUESTS": "2",
           "LINGUAFUSION_LIMITS__MAX_GLOSSARIES_PER_KEY": "3"}
    url, proc = start_server(state, "--log-level", "info", env=env)
    yield Srv(url, proc, state, admin)
    stop_server(proc)


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    """`--no-auth`: the anonymous user has admin scope, so only loopback hosts and the server's own pages."""
    state = tmp_path_factory.mktemp("loopback")
    url, proc = start_server(state, "--no-auth")
    yield Srv(url, proc, state)
    stop_server(proc)


@contextlib.contextmanager
def serving(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Srv]:
    url, proc = start_server(tmp, *args, env=env)
    try:
        yield Srv(url, proc, tmp)
    finally:
        stop_server(proc)


# ---- WebSocket helpers -----------------------------------------------------------------------------------------
def start(inputs: list[str], **kw: Any) -> dict[str, Any]:
    return {"type": "start", "source_lang": "en", "target_langs": ["es"], "partials": False, "inputs": inputs, **kw}


async def connect(url: str, key: str | None = None, **kw: Any) -> Any:
    from websockets.asyncio.client import connect as ws_connect

    headers = {"Authorization": f"Bearer {key}"} if key else None
    return await ws_connect(url, additional_headers=headers, open_timeout=GUARD_S, max_size=None, **kw)


async def event(ws: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), GUARD_S))
    return out


async def ending(ws: Any) -> tuple[list[dict[str, Any]], int | None]:
    """The events left until the server closes, and its close code."""
    from websockets.exceptions import ConnectionClosed

    events = []
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(GUARD_S):
            async for raw in ws:
                events.append(json.loads(raw))
    return events, ws.close_code


async def opened(url: str, key: str | None, msg: dict[str, Any], **kw: Any) -> tuple[Any, dict[str, Any]]:
    ws = await connect(url, key, **kw)
    await ws.send(json.dumps(msg))
    ready = await event(ws)
    assert ready["type"] == "ready", ready
    return ws, ready


def pcm(seconds: float, level: float = 0.0) -> bytes:
    n = int(seconds * 16000)
    return (np.sin(np.arange(n) / 8) * level * 32767).astype("<i2").tobytes()


def espeak(text: str, voice: str) -> bytes:
    return subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True,
                          timeout=60).stdout


def metric(srv: Srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers=srv.auth(), timeout=10).text  # an admin key (auth is on)
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for(pred: Any, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not pred():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# ==== Resource exhaustion ========================================================================================
def chunked_upload(srv: Srv, path: str, key: str, field: str, total: int) -> bytes:
    """POST ``total`` bytes of a multipart file part with Transfer-Encoding: chunked (no Content-Length), never
    sending the end of the body; return what the server answers."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=GUARD_S)
    with s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
                  "Content-Type: multipart/form-data; boundary=zz\r\nTransfer-Encoding: chunked\r\n\r\n".encode())

        def chunk(data: bytes) -> None:
            s.sendall(b"%x\r\n" % len(data) + data + b"\r\n")

        chunk(f'--zz\r\nContent-Disposition: form-data; name="{field}"; filename="big.bin"\r\n\r\n'.encode())
        sent = 0
        with contextlib.suppress(OSError):  # the server may stop reading once it has answered
            while sent < total:
                chunk(b"\0" * 65536)
                sent += 65536
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = s.recv(65536)
                if not data:
                    break
                answer += data
        return answer


@pytest.mark.parametrize("path,field", [("/v1/translate", "file"), ("/v1/glossaries", "file")])
def test_a_chunked_upload_stops_at_the_limit(guarded: Srv, path: str, field: str) -> None:
    # 1.5 MiB against a 1 MiB limit, and the body never ends: the old server waited for the end (holding all of it
    # in a temporary file); now it answers 413 once the limit is passed
    answer = chunked_upload(guarded, path, guarded.admin or "", field, total=MiB + MiB // 2)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert json.loads(body)["error"]["code"] == "too_large"


def test_a_glossary_of_5000_terms_is_matched_and_the_deadline_holds(guarded: Srv, tmp_path: Path) -> None:
    terms = [f"term{i:04d}" for i in range(4999)] + ["bank"]
    csv = "\n".join(f"{t},{t.upper()}" for t in terms[:-1]) + "\nbank,banco\n"
    text = " ".join(f"The bank opens at {i} today." for i in range(40))  # 40 segments
    r = httpx.post(guarded.url + "/v1/glossaries", files={"file": ("g.csv", csv.encode())},
                   headers=guarded.auth(), timeout=60)
    assert r.status_code == 201 and r.json()["terms"] == 5000, r.text
    gid = r.json()["glossary_id"]
    form = {"text": text, "source_lang": "en", "target_lang": "es", "enable_glossary": "true", "glossary_id": gid}
    r = httpx.post(guarded.url + "/v1/translate", data=form, headers=guarded.auth(), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["glossary_terms_applied"] == [{"source": "bank", "target": "banco"}]
    assert r.json()["text"].count("banco") == 40
    # the same request with request_timeout_s far below the work: the old server answered 200 late (a thread
    # cannot be cancelled); now the work stops itself and the client gets 504 timeout
    with serving(tmp_path, "--no-auth", env={"LINGUAFUSION_SERVER__REQUEST_TIMEOUT_S": "0.05"}) as quick:
        r = httpx.post(quick.url + "/v1/glossaries", files={"file": ("g.csv", csv.encode())}, timeout=60)
        form["glossary_id"] = r.json()["glossary_id"]
        r = httpx.post(quick.url + "/v1/translate", data=form, timeout=120)
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "timeout" and r.json()["error"]["details"]["limit"] == "request_timeout_s"


def test_glossaries_per_key_are_bounded(guarded: Srv) -> None:
    key, _ = guarded.new_key("glossaries")
    made = []
    for i in range(3):
        r = httpx.post(guarded.url + "/v1/glossaries", data={"terms": f"a{i},b{i}"}, headers=guarded.auth(key),
                       timeout=30)
        assert r.status_code == 201, r.text
        made.append(r.json()["glossary_id"])
    r = httpx.post(guarded.url + "/v1/glossaries", data={"terms": "c,d"}, headers=guarded.auth(key), timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "quota_exceeded", r.text
    r = httpx.delete(f"{guarded.url}/v1/glossaries/{made[0]}", headers=guarded.auth(key), timeout=30)
    assert r.status_code == 200
    r = httpx.post(guarded.url + "/v1/glossaries", data={"terms": "c,d"}, headers=guarded.auth(key), timeout=30)
    assert r.status_code == 201, r.text
    r = httpx.post(guarded.url + "/v1/glossaries", data={"terms": "x" * 101 + ",y"}, headers=guarded.auth(),
                   timeout=30)
    assert r.status_code == 400  # a term longer than MAX_TERM_CHARS


def test_a_glossary_is_deleted_only_by_its_own_key(guarded: Srv) -> None:
    owner, _ = guarded.new_key("glossary-owner")
    other, _ = guarded.new_key("glossary-other")
    r = httpx.post(guarded.url + "/v1/glossaries", data={"terms": "bank,orilla"}, headers=guarded.auth(owner),
                   timeout=30)
    gid = r.json()["glossary_id"]
    url = f"{guarded.url}/v1/glossaries/{gid}"
    r = httpx.delete(url, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    r = httpx.delete(url, headers=guarded.auth(other), timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"  # another key's id does not exist
    r = httpx.delete(f"{guarded.url}/v1/glossaries/{'x' * 5000}", headers=guarded.auth(owner), timeout=30)
    assert r.status_code in (404, 414) and "error" in r.json()
    assert httpx.get(url, headers=guarded.auth(owner), timeout=30).status_code == 200  # still there
    assert httpx.delete(url, headers=guarded.auth(owner), timeout=30).status_code == 200
    assert httpx.get(url, headers=guarded.auth(owner), timeout=30).status_code == 404


async def test_file_requests_get_a_fair_share_per_key(guarded: Srv) -> None:
    """One translation at a time, two waiting. Key A takes the slot with a long recording and fills the waiting
    room; key B's request still gets in (A's newest waiting request gives way, 429) and runs before A's other one.
    The old server refused B with 429."""
    a, _ = guarded.new_key("flooder")
    b, _ = guarded.new_key("neighbour")
    talk = " ".join(["The committee met on Tuesday to discuss the budget for the coming year."] * 10)
    # about 50 s of speech (seconds of ASR), as Opus to stay under this server's 1 MiB upload limit
    long_ogg = await asyncio.to_thread(lambda: encode_audio(espeak(talk, "en-us"), "ogg", "libopus"))
    short = {"text": "Good morning.", "source_lang": "en", "target_lang": "es"}
    finished: list[str] = []

    async def post(name: str, key: str, **kw: Any) -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(guarded.url + "/v1/translate", headers=guarded.auth(key), **kw)
        finished.append(name)
        return r

    in_flight, waiting = "linguafusion_requests_in_flight", "linguafusion_requests_waiting"
    long = asyncio.create_task(post("a-long", a, files={"file": ("talk.ogg", long_ogg)},
                                    data={"source_lang": "en", "target_lang": "es", "source_modality": "audio"}))
    await asyncio.to_thread(wait_for, lambda: metric(guarded, in_flight) == 1, "A's long request to run")
    a2 = asyncio.create_task(post("a2", a, data=short))
    await asyncio.to_thread(wait_for, lambda: metric(guarded, waiting) == 1, "A's second request to wait")
    a3 = asyncio.create_task(post("a3", a, data=short))
    await asyncio.to_thread(wait_for, lambda: metric(guarded, waiting) == 2, "A's third request to wait")
    assert not long.done(), "the long request ended before the queue filled: make it longer"
    b1 = asyncio.create_task(post("b1", b, data=short))
    r_long, r2, r3, rb = await asyncio.gather(long, a2, a3, b1)
    assert rb.status_code == 200 and rb.json()["text"], rb.text
    assert r3.status_code == 429 and "fair share" in r3.json()["error"]["message"], r3.text
    assert r_long.status_code == 200 and r2.status_code == 200
    assert finished.index("b1") < finished.index("a2")  # the freed slot went to B first


async def test_model_batches_are_shared_between_keys(guarded: Srv) -> None:
    """Key A floods its stream with 40 texts of 19,000 characters; once they are queued, key B sends one line.
    B's caption comes back while A's flood is still being translated (the old server queued it behind A's batch of
    32: B's caption came after 32 of A's)."""
    a, _ = guarded.new_key("stream-flooder")
    b, _ = guarded.new_key("stream-neighbour")
    ws_a, _ = await opened(guarded.ws, a, start(["text"]))
    ws_b, _ = await opened(guarded.ws, b, start(["text"]))  # the same SLO class: only fairness puts B first
    arrivals: list[tuple[str, int]] = []
    b_final = asyncio.Event()

    async def read(name: str, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):
            async for raw in ws:
                e = json.loads(raw)
                if e["type"] == "final":
                    arrivals.append((name, e["seq"]))
                    if name == "B":
                        b_final.set()

    readers = [asyncio.create_task(read("A", ws_a)), asyncio.create_task(read("B", ws_b))]
    page = ("The bank opens at nine and the market closes at five in the evening. " * 300)[:19_000]
    for i in range(40):
        await ws_a.send(json.dumps({"type": "text", "text": page, "ts": float(i)}))
    depth = 'linguafusion_queue_depth{model="mt:en-es"}'
    await asyncio.to_thread(wait_for, lambda: metric(guarded, depth) >= 30, "A's flood to be queued")
    await ws_b.send(json.dumps({"type": "text", "text": "Good morning.", "ts": 0.0}))
    await asyncio.wait_for(b_final.wait(), 120)
    a_before_b = sum(1 for name, _ in arrivals[:arrivals.index(("B", 1))] if name == "A")
    await ws_a.close()
    await ws_b.close()
    for t in readers:
        await asyncio.wait_for(t, GUARD_S)
    assert a_before_b < 10, arrivals[:20]


async def test_a_stream_text_obeys_max_text_chars(guarded: Srv) -> None:
    ws, _ = await opened(guarded.ws, guarded.admin, start(["text"]))
    await ws.send(json.dumps({"type": "text", "text": "a" * 1_200_000, "ts": 0.0}))
    events, code = await ending(ws)
    assert [e["code"] for e in events if e["type"] == "error"] == ["too_large"] and code == 4413
    assert not any(e["type"] == "final" for e in events)


@contextlib.asynccontextmanager
async def in_loop_server(tmp: Path, **server: Any) -> AsyncIterator[tuple[str, Any]]:
    """A real uvicorn on this test's event loop (so the test can hold a decoder or a model still)."""
    s = Settings(state_dir=tmp)
    s.server.auth = False
    for k, v in server.items():
        setattr(s.server, k, v)
    app = create_app(s, warm=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for it)
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def healthz_while(url: str, held: threading.Event, release: threading.Event) -> int:
    """From another thread: /healthz while the server is inside the held call (then let it go)."""
    try:
        assert held.wait(GUARD_S), "the held call never started"
        return httpx.get(url + "/healthz", timeout=10).status_code
    finally:
        release.set()


async def test_image_decoding_and_vad_stay_off_the_event_loop(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's 6000x6000 PNGs and 3.8 MB PCM messages stalled /healthz. Here the decoder and the VAD are held
    still inside their call: /healthz must answer meanwhile (it could not if either ran on the loop)."""
    import lingua_fusion.media as media

    held, release = threading.Event(), threading.Event()

    def slow_decode(data: bytes, limits: Any) -> np.ndarray:
        held.set()
        release.wait(GUARD_S)
        return np.full((64, 64, 3), 255, dtype=np.uint8)

    monkeypatch.setattr(media, "decode_image", slow_decode)
    async with in_loop_server(tmp_path) as (url, app):
        ws, _ = await opened(url.replace("http", "ws") + "/v1/streams", None, start(["image", "audio"]))
        await ws.send(json.dumps({"type": "image", "ts": 0.0, "data": base64.b64encode(b"png").decode()}))
        assert await asyncio.to_thread(healthz_while, url, held, release) == 200

        vad = app.state.engine.registry.vad()
        held.clear()
        release.clear()

        def slow_vad(audio: np.ndarray) -> np.ndarray:
            held.set()
            release.wait(GUARD_S)
            return np.zeros(len(audio) // 512, dtype=np.float32)

        monkeypatch.setattr(vad, "probabilities", slow_vad)
        await ws.send(pcm(1.0))
        assert await asyncio.to_thread(healthz_while, url, held, release) == 200
        await ws.send(json.dumps({"type": "end"}))
        events, code = await ending(ws)
        assert events[-1]["type"] == "closed" and code == 1000


async def test_images_in_flight_are_bounded(tmp_path: Path) -> None:
    """A stream that keeps sending images while its slides are still being read gets `overloaded` for the ones
    beyond two in flight (decoded frames held: at most two per stream, and max_images_in_flight, here 3, across
    the server), and its stream goes on."""
    from conftest import render_slide

    release = threading.Event()

    class HeldOCR:
        def recognize(self, image: np.ndarray, language: str | None = None) -> list[Any]:
            release.wait(GUARD_S)
            return []

    async with in_loop_server(tmp_path, max_images_in_flight=3) as (url, app):
        app.state.engine.registry.ocr = lambda: HeldOCR()
        ws_url = url.replace("http", "ws") + "/v1/streams"
        ws, _ = await opened(ws_url, None, start(["image"]))
        other, _ = await opened(ws_url, None, start(["image"]))
        slide = base64.b64encode(render_slide(["Slide"], size=(320, 240))).decode()
        for i in range(4):
            await ws.send(json.dumps({"type": "image", "ts": float(i), "data": slide}))
        errors = [await event(ws), await event(ws)]
        for i in range(2):  # the server holds 2 of the first stream's frames: one more fits
            await other.send(json.dumps({"type": "image", "ts": float(i), "data": slide}))
        server_full = await event(other)
        release.set()
        assert [e["code"] for e in errors] == ["overloaded", "overloaded"], errors
        assert "this stream" in errors[0]["message"]
        assert server_full["code"] == "overloaded" and "the server" in server_full["message"], server_full
        for w in (ws, other):
            await w.send(json.dumps({"type": "end"}))
            events, code = await ending(w)
            assert events[-1]["type"] == "closed" and code == 1000


def test_an_idle_socket_and_a_slow_header_are_closed(guarded: Srv) -> None:
    # head timeout 2 s on this server; the old server kept both open for good (the recv below would time out)
    idle = socket.create_connection(("127.0.0.1", guarded.port), timeout=GUARD_S)
    with idle:
        assert read_until_closed(idle) == b""
    slow = socket.create_connection(("127.0.0.1", guarded.port), timeout=0.5)
    closed = False
    with slow:
        deadline = time.monotonic() + GUARD_S
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000:
            assert time.monotonic() < deadline, "a header sent a byte at a time was never cut off"
            try:
                slow.send(bytes([byte]))
                if slow.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue  # nothing to read yet: send the next byte
            except OSError:
                closed = True
                break
    assert closed


def test_connections_beyond_the_cap_are_refused(tmp_path: Path) -> None:
    env = {"LINGUAFUSION_SERVER__MAX_CONNECTIONS": "4", "LINGUAFUSION_SERVER__HEADER_TIMEOUT_S": "60"}
    with serving(tmp_path, "--no-auth", env=env) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=GUARD_S) for _ in range(4)]
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=GUARD_S)
        with extra:
            answer = read_until_closed(extra)  # the old server kept it open and silent (300 of them, in the issue)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "overloaded"
        for s in idle:
            s.close()
        wait_for(lambda: _healthy(srv.url), "the server to serve again once the idle sockets closed")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


async def test_the_key_is_checked_before_the_first_message(guarded: Srv) -> None:
    ws = await connect(guarded.ws)  # no key; it sends nothing (the old server waited for its first message)
    events, code = await ending(ws)
    assert [e["code"] for e in events] == ["unauthenticated"] and code == 4401


async def test_a_message_over_the_frame_limit_is_refused_by_the_websocket_layer(guarded: Srv) -> None:
    from websockets.exceptions import ConnectionClosed

    ws, _ = await opened(guarded.ws, guarded.admin, start(["audio"]))
    with contextlib.suppress(ConnectionClosed):
        await ws.send(b"\0" * (6 * MiB))  # over the 4 MiB stream message limit (the old frame limit was 16 MiB)
    _events, code = await ending(ws)
    assert code == 1009


async def test_a_stream_is_not_compressed_so_a_small_frame_never_inflates_to_megabytes(guarded: Srv) -> None:
    """A client offers permessage-deflate (browsers and websockets do) and the server declines it: uvicorn inflated
    each compressed message on the event loop as its bytes arrived, and 4 MiB of silence deflates to about 4 KB, so
    one 64 KB read held a dozen 4 MiB messages; eight streams sending them stalled /healthz for 30 s and ended in
    1011. Uncompressed, a 4 MiB message costs its sender 4 MiB."""
    ws, _ = await opened(guarded.ws, guarded.admin, start(["audio"]))
    assert ws.protocol.extensions == []  # nothing negotiated: the client sends (and the server reads) plain frames
    await ws.send(b"\0" * (30 * 32000))  # 30 s of silence (the most one message may carry), ~1 KB deflated
    await ws.send(json.dumps({"type": "end"}))
    events, code = await ending(ws)
    assert code == 1000 and events[-1]["type"] == "closed", events


# ==== Identity and secrets =======================================================================================
async def test_a_stream_resumes_only_with_its_own_key(guarded: Srv) -> None:
    a, _ = guarded.new_key("owner")
    b, _ = guarded.new_key("thief")
    ws_a, ready = await opened(guarded.ws, a, start(["text"]))
    await ws_a.send(json.dumps({"type": "text", "text": "The dog is black.", "ts": 0.0}))
    while (e := await event(ws_a))["type"] != "final":
        pass
    resume = {"type": "start", "resume": {"stream_id": ready["stream_id"], "resume_token": ready["resume_token"],
                                          "last_seq": 0}}
    thief = await connect(guarded.ws, b)
    await thief.send(json.dumps(resume))
    events, code = await ending(thief)  # the old server resumed it for B and sent B the owner's final
    assert [e["type"] for e in events] == ["error"] and events[0]["code"] == "forbidden" and code == 4403
    # the owner, from a second connection, takes the stream over; the first connection is told why it ends
    ws_a2 = await connect(guarded.ws, a)
    await ws_a2.send(json.dumps(resume))
    first = await event(ws_a2)
    assert first["type"] == "ready" and first["resumed"] is True
    replayed = await event(ws_a2)
    assert replayed["type"] == "final" and replayed["seq"] == 1 and replayed["text"] == e["text"]
    events, code = await ending(ws_a)  # the old server closed it with a plain 1000 and no event
    assert events[-1]["code"] == "taken_over" and code == 4409
    await ws_a2.close()


async def test_revoking_a_key_closes_its_streams(guarded: Srv) -> None:
    key, key_id = guarded.new_key("to-revoke")
    ws, ready = await opened(guarded.ws, key, start(["text"]))
    r = httpx.delete(f"{guarded.url}/v1/keys/{key_id}", headers=guarded.auth(), timeout=10)
    assert r.status_code == 200 and r.json()["streams_closed"] == 1
    events, code = await ending(ws)  # the old server left it open
    assert events[-1]["code"] == "unauthenticated" and code == 4401
    again = await connect(guarded.ws, key)
    await again.send(json.dumps({"type": "start", "resume": {"stream_id": ready["stream_id"],
                                                              "resume_token": ready["resume_token"]}}))
    events, code = await ending(again)
    assert events[0]["code"] == "unauthenticated" and code == 4401


async def test_browser_keys_stay_out_of_the_logs(guarded: Srv) -> None:
    key, _ = guarded.new_key("browser")
    # the old way (docs/streaming.md told browsers to do this): still served, but masked in the access log
    ws, _ = await opened(f"{guarded.ws}?api_key={key}", None, start(["text"]))
    await ws.close()
    r = httpx.get(f"{guarded.url}/v1/glossaries?api_key={key}", timeout=10)
    assert r.status_code == 401
    # the new way: the key as a subprotocol; the server answers with "linguafusion", never the key
    ws, _ = await opened(guarded.ws, None, start(["text"]), subprotocols=["linguafusion", f"bearer.{key}"])
    assert ws.subprotocol == "linguafusion"
    await ws.close()
    wait_for(lambda: guarded.log().count("api_key=***") >= 2, "the access log lines")
    assert key not in guarded.log()


def test_no_server_secret_path_or_address_reaches_a_client(tmp_path: Path) -> None:
    """A Redis URL with a password (Redis down) and an empty model cache: the log has no password, and what
    clients read names neither the cache directory nor Redis's address."""
    port = free_port()  # nothing listens there
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    env = {"LINGUAFUSION_STATE__REDIS_URL": f"redis://:s3cret-pw@127.0.0.1:{port}/0",
           "LINGUAFUSION_MODELS__CACHE_DIR": str(cache)}
    with serving(tmp_path, "--no-auth", env=env) as srv:
        async def stream_error() -> dict[str, Any]:
            ws = await connect(srv.ws)
            await ws.send(json.dumps(start(["text"])))
            return await event(ws)

        err = asyncio.run(stream_error())
        assert err["type"] == "error" and err["code"] == "state_store_unavailable"
        r = httpx.post(srv.url + "/v1/translate", files={"file": ("fr.wav", espeak("Bonjour à tous.", "fr"))},
                       data={"source_modality": "audio", "source_lang": "fr", "target_lang": "es"}, timeout=120)
        assert r.status_code == 503, r.text
        for told in (json.dumps(err), r.text):
            assert "s3cret-pw" not in told and f"127.0.0.1:{port}" not in told and str(cache) not in told, told
        log = srv.log()
    assert "s3cret-pw" not in log and "redis://:***@" in log


def test_host_origin_and_content_type_on_a_keyless_server(loopback: Srv) -> None:
    url = loopback.url
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200
    r = httpx.get(url + "/healthz", headers={"Host": "evil.example"}, timeout=10)  # DNS rebinding
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    # a page can POST text/plain anywhere without a preflight: the old server parsed it and minted an admin key
    r = httpx.post(url + "/v1/keys", content=b'{"scopes": ["admin"]}', headers={"Content-Type": "text/plain"},
                   timeout=10)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_content_type"
    r = httpx.post(url + "/v1/keys", json={"scopes": ["admin"]}, headers={"Origin": "http://evil.example"},
                   timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(url + "/v1/translate", data={"text": "hi", "target_lang": "es"},
                   headers={"Origin": "http://evil.example"}, timeout=10)
    assert r.status_code == 403
    r = httpx.post(url + "/v1/keys", json={"name": "from my own page"}, headers={"Origin": url}, timeout=10)
    assert r.status_code == 201  # the server's own origin, and clients that send no Origin, are served


@pytest.mark.parametrize("body", [b"[" * 50_000, b'{"name": NaN}', b'{"name": "x"', b"\xff\xfe{}",
                                  b'{"name": "x\\ud800"}'])
def test_json_routes_refuse_what_is_not_json(loopback: Srv, body: bytes) -> None:
    for path in ("/v1/keys", "/v1/admin/faults"):
        r = httpx.post(loopback.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=10)
        # nesting 50,000 deep was a 500 (RecursionError in the route's JSON parser); so was a lone surrogate
        # ("\ud800": SQLite cannot store it). Nesting past limits.max_json_depth is now refused before parsing
        if body.startswith(b"[["):
            assert r.status_code == 413 and r.json()["error"]["details"]["limit"] == "max_json_depth", r.text
        else:
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text


def test_a_long_path_is_answered_at_once(loopback: Srv) -> None:
    # a 60,000-character glossary id: its 404 message went through the secret masks (quadratic: 7 s of CPU)
    r = httpx.get(f"{loopback.url}/v1/glossaries/{'a' * 60_000}", timeout=GUARD_S)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_a_websocket_from_another_origin_is_refused(loopback: Srv) -> None:
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        await connect(loopback.ws, origin="http://evil.example")  # the old server accepted it
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == "origin_not_allowed"
    ws, _ = await opened(loopback.ws, None, start(["text"]), origin=loopback.url)
    await ws.close()


def test_state_files_are_private(guarded: Srv) -> None:
    assert stat.S_IMODE(guarded.state.stat().st_mode) == 0o700
    files = [p for p in guarded.state.iterdir() if p.suffix != ".log"]
    assert any(p.name == "linguafusion.sqlite3" for p in files) and any(p.name == "streams.sqlite3" for p in files)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# ==== Crashes ====================================================================================================
@pytest.mark.parametrize("first", ["[" * 50_000, '{"type": "start", "importance": NaN}', '"start"'])
async def test_a_malformed_start_message_gets_an_error_and_a_close_code(guarded: Srv, first: str) -> None:
    ws = await connect(guarded.ws, guarded.admin)
    await ws.send(first)
    events, code = await ending(ws)  # 50,000 '[' used to drop the connection with no close frame
    if first.startswith("[["):  # past limits.max_json_depth: refused before parsing
        assert [e["code"] for e in events] == ["too_large"] and code == 4413
    else:
        assert [e["code"] for e in events] == ["invalid_parameter"] and code == 4400


@pytest.mark.parametrize("message", [
    {"type": "audio", "ts": 1e308},  # OverflowError in the timeline, before
    {"type": "audio", "ts": -1e300},
    {"type": "audio", "ts": True},
    {"type": "image", "ts": 1e308},
    {"type": "text", "text": "hello", "ts": 1e300},
    {"type": "audio", "data": "not base64!"},
    {"type": ["audio"]},
])
async def test_a_hostile_message_gets_an_error_event_and_the_stream_goes_on(guarded: Srv,
                                                                            message: dict[str, Any]) -> None:
    ws, _ = await opened(guarded.ws, guarded.admin, start(["audio", "image", "text"]))
    message.setdefault("data", base64.b64encode(pcm(0.1)).decode())
    await ws.send(json.dumps(message))
    err = await event(ws)
    assert err["type"] == "error" and err["code"] == "invalid_parameter", err
    await ws.send(json.dumps({"type": "end"}))
    events, code = await ending(ws)
    assert events[-1]["type"] == "closed" and code == 1000


async def test_a_nan_in_a_later_message_ends_the_stream_with_a_code(guarded: Srv) -> None:
    ws, _ = await opened(guarded.ws, guarded.admin, start(["audio"]))
    await ws.send('{"type": "audio", "ts": NaN, "data": ""}')
    events, code = await ending(ws)
    assert events[-1]["code"] == "invalid_parameter" and code == 4400
