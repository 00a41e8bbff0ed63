"""/v1/vocabularies over real HTTP on a real server: per-key isolation, teaching with landmark JSON and with a
video (the server runs the real mediapipe worker on its frames), recognition with translation, export / import,
and bad input answered with 4xx codes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import BIN, start_server, stop_server

from lingua_fusion.errors import InvalidParameter, NotFound
from lingua_fusion.sdk.stream import LocalStream, RemoteStream
from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.synthetic import render_hand

PORT = 18511
VOCAB = syn.sign_vocabulary(5, seed=3)


@dataclass
class Live:
    url: str
    a: httpx.Client
    b: httpx.Client


def _key(state: object) -> str:
    return subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    state = tmp_path_factory.mktemp("vision-state")
    ka, kb = _key(state), _key(state)
    url, proc = start_server(state, port=PORT)
    a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ka}"}, timeout=120)
    b = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {kb}"}, timeout=120)
    try:
        yield Live(url, a, b)
    finally:
        a.close()
        b.close()
        stop_server(proc)


def _teach(client: httpx.Client, name: str, per_sign: int = 2, seed: int = 1) -> str:
    r = client.post("/v1/vocabularies", json={"name": name, "kind": "sign", "lang": "en"})
    assert r.status_code == 201, r.text
    vid = r.json()["vocabulary_id"]
    rng = np.random.default_rng(seed)
    for spec, gloss in zip(VOCAB, ["hello", "thanks", "water", "friend", "house"], strict=True):
        for _ in range(per_sign):
            seq = syn.perform_sign(spec, syn.random_performance(rng, mirrored=False), rng)
            r = client.post(f"/v1/vocabularies/{vid}/examples", json={"gloss": gloss, "frames": seq.to_json()})
            assert r.status_code == 201, r.text
    return vid


def test_a_key_recognises_with_its_vocabulary_and_mt_translates_the_gloss(live: Live) -> None:
    vid = _teach(live.a, "greetings")
    rng = np.random.default_rng(7)
    seq = syn.perform_sign(VOCAB[2], syn.random_performance(rng, mirrored=True), rng)  # left-handed, unseen
    r = live.a.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": seq.to_json(), "target_lang": "es"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["source_text"] == "water" and body["modalities"] == ["sign"]
    assert body["text"].strip(" .").lower() == "agua"
    assert body["glosses"][0]["gloss"] == "water" and 0 < body["glosses"][0]["confidence"] <= 1
    other = syn.perform_sign(syn.sign_vocabulary(1, seed=99)[0], syn.random_performance(rng), rng)
    r = live.a.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": other.to_json()})
    assert r.json()["glosses"][0]["gloss"] == "unknown" and r.json()["source_text"] == ""


def test_another_key_can_never_list_read_use_or_delete_a_vocabulary(live: Live) -> None:
    vid = _teach(live.a, "private", per_sign=1)
    assert vid not in [v["vocabulary_id"] for v in live.b.get("/v1/vocabularies").json()["vocabularies"]]
    assert vid in [v["vocabulary_id"] for v in live.a.get("/v1/vocabularies").json()["vocabularies"]]
    seq = syn.perform_sign(VOCAB[0], syn.Performance(), np.random.default_rng(0)).to_json()
    for method, path, body in [("GET", f"/v1/vocabularies/{vid}", None),
                               ("GET", f"/v1/vocabularies/{vid}/export", None),
                               ("POST", f"/v1/vocabularies/{vid}/recognise", {"frames": seq}),
                               ("POST", f"/v1/vocabularies/{vid}/examples", {"gloss": "x", "frames": seq}),
                               ("DELETE", f"/v1/vocabularies/{vid}", None)]:
        r = live.b.request(method, path, json=body)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (method, path, r.text)
    assert live.a.get(f"/v1/vocabularies/{vid}").json()["examples"]  # untouched: still A's, still taught
    assert httpx.get(f"{live.url}/v1/vocabularies").status_code == 401


def test_export_and_import_round_trip_recognises_the_same(live: Live) -> None:
    vid = _teach(live.a, "to-share", seed=5)
    doc = live.a.get(f"/v1/vocabularies/{vid}/export").json()
    assert doc["format"] == "linguafusion-vocabulary/1" and len(doc["examples"]) == 10
    r = live.b.post("/v1/vocabularies/import", json=doc)  # shared by its owner as a file, imported by B
    assert r.status_code == 201, r.text
    copy = r.json()
    assert copy["examples"] == 10 and copy["glosses"] == 5 and copy["vocabulary_id"] != vid
    assert live.b.get(f"/v1/vocabularies/{copy['vocabulary_id']}/export").json()["examples"] == doc["examples"]
    rng = np.random.default_rng(9)
    for spec in VOCAB:
        frames = syn.perform_sign(spec, syn.random_performance(rng), rng).to_json()
        mine = live.a.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": frames}).json()["glosses"][0]
        theirs = live.b.post(f"/v1/vocabularies/{copy['vocabulary_id']}/recognise",
                             json={"frames": frames}).json()["glosses"][0]
        assert mine == theirs
    assert live.b.post("/v1/vocabularies/import", json={**doc, "format": "x"}).status_code == 400
    bad = {**doc, "examples": doc["examples"][:1] + [{"gloss": "", "frames": []}]}
    assert live.b.post("/v1/vocabularies/import", json=bad).json()["error"]["code"] == "invalid_parameter"


def test_bad_requests_are_4xx_with_codes(live: Live) -> None:
    r = live.a.post("/v1/vocabularies", json={"name": "x", "kind": "gesture"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter"
    r = live.a.post("/v1/vocabularies", json={"name": "x", "kind": [[1, 2], [3, 4]]})  # not a numpy array here
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter"
    vid = live.a.post("/v1/vocabularies", json={"name": "empty", "kind": "sign"}).json()["vocabulary_id"]
    frames = syn.perform_sign(VOCAB[0], syn.Performance(), np.random.default_rng(0)).to_json()
    r = live.a.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": frames})
    assert r.status_code == 400 and "no examples" in r.json()["error"]["message"]
    lips = syn.perform_lips(syn.lip_vocabulary(["a"])[0], syn.Performance(), np.random.default_rng(0)).to_json()
    r = live.a.post(f"/v1/vocabularies/{vid}/examples", json={"gloss": "hi", "frames": lips})  # no hands in it
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter"
    r = live.a.post(f"/v1/vocabularies/{vid}/examples", json={"gloss": "hi", "frames": [{"t": 0, "left_hand": [1]}]})
    assert r.status_code == 400 and "left_hand" in r.json()["error"]["message"]
    r = live.a.post(f"/v1/vocabularies/{vid}/examples", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = live.a.post(f"/v1/vocabularies/{vid}/examples", data={"gloss": "hi"}, files={"file": ("x.mp4", b"junk")})
    assert 400 <= r.status_code < 500 and r.json()["error"]["code"] in {"unsupported_media", "corrupt_media"}
    r = live.a.post(f"/v1/vocabularies/{vid}/recognise", json={"frames": frames, "target_lang": "xx"})
    assert 400 <= r.status_code < 500


# ---- a video taught and recognised through the real mediapipe worker ---------------------------------------------
def _video(path: list[tuple[float, float]], fps: int = 15) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        for p in path:
            for packet in stream.encode(av.VideoFrame.from_ndarray(render_hand(p), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _line(n: int, y: float = 0.75) -> list[tuple[float, float]]:
    return [(0.3 + 0.4 * i / (n - 1), y) for i in range(n)]


def _circle(n: int) -> list[tuple[float, float]]:
    return [(0.5 + 0.15 * np.cos(2 * np.pi * i / (n - 1)), 0.7 + 0.1 * np.sin(2 * np.pi * i / (n - 1)))
            for i in range(n)]


def test_a_sign_taught_from_video_is_recognised_in_another_video(live: Live) -> None:
    vid = live.a.post("/v1/vocabularies", json={"name": "video", "kind": "sign"}).json()["vocabulary_id"]
    for gloss, path in (("across", _line(16)), ("round", _circle(16))):
        r = live.a.post(f"/v1/vocabularies/{vid}/examples", data={"gloss": gloss},
                        files={"file": ("sign.mp4", _video(path), "video/mp4")})
        assert r.status_code == 201, r.text
        assert r.json()["frames"] >= 12
    # performed again, slower and lower in the picture
    r = live.a.post(f"/v1/vocabularies/{vid}/recognise", data={"target_lang": "es"},
                    files={"file": ("query.mp4", _video(_line(22, y=0.8)), "video/mp4")})
    assert r.status_code == 200, r.text
    assert [g["gloss"] for g in r.json()["glosses"]] == ["across"]


def test_the_sdk_teaches_exports_to_a_file_and_imports(live: Live, tmp_path: Path) -> None:
    from lingua_fusion import MultimodalTranslator

    with MultimodalTranslator(api_key=live.a.headers["Authorization"][7:], base_url=live.url) as t:
        vid = t.create_vocabulary("sdk", kind="lip")["vocabulary_id"]
        rng = np.random.default_rng(3)
        words = syn.lip_vocabulary(["yes", "no", "stop"], seed=2)
        for w in words:
            for _ in range(3):
                t.add_example(vid, w.gloss, frames=syn.perform_lips(w, syn.random_performance(rng), rng))
        t.export_vocabulary(vid, tmp_path / "lips.json")
        copy = t.import_vocabulary(tmp_path / "lips.json", name="copy")
        assert copy["name"] == "copy" and copy["kind"] == "lip" and copy["examples"] == 9
        said = syn.perform_lips(words[2], syn.random_performance(rng), rng)
        assert t.recognise(copy["vocabulary_id"], frames=said)["source_text"] == "stop"
        with pytest.raises(NotFound):
            t.recognise("vo_000000000000", frames=said)
        with pytest.raises(InvalidParameter):
            t.recognise(vid)  # neither frames nor video


def test_the_cli_teaches_and_recognises_in_process(tmp_path: Path) -> None:
    env = {**os.environ, "LINGUAFUSION_STATE_DIR": str(tmp_path / "state")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN), "vocab", *args], capture_output=True, text=True, timeout=120, env=env)

    vid = json.loads(cli("create", "mine", "--kind", "sign").stdout)["vocabulary_id"]
    rng = np.random.default_rng(4)
    for spec, gloss in zip(VOCAB[:3], ["one", "two", "three"], strict=True):
        for k in range(2):
            path = tmp_path / f"{gloss}{k}.json"
            path.write_text(json.dumps(syn.perform_sign(spec, syn.random_performance(rng), rng).to_json()))
            assert cli("teach", vid, gloss, "--frames", str(path)).returncode == 0
    query = tmp_path / "query.json"
    query.write_text(json.dumps({"frames": syn.perform_sign(VOCAB[1], syn.random_performance(rng), rng).to_json()}))
    out = cli("recognise", vid, "--frames", str(query))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["source_text"] == "two"
    assert json.loads(cli("list").stdout)["vocabularies"][0]["examples"] == 6
    bad = cli("show", "vo_missing")
    assert bad.returncode == 2 and bad.stderr.startswith("error [not_found]")
    bad = cli("teach", vid, "x", "--frames", str(tmp_path / "nope.json"))
    assert bad.returncode == 2 and "error [invalid_parameter]" in bad.stderr


async def _camera(s: RemoteStream | LocalStream, empty: bytes, frames: list[tuple[float, bytes]]) -> None:
    """A camera, in real time: an empty picture, the sign (at 15 frames a second), the empty picture again."""
    for k in range(5):
        await s.send_frame(empty, ts=k / 10)
        await asyncio.sleep(0.1)
    for t, data in frames:
        await s.send_frame(data, ts=t)
        await asyncio.sleep(1 / 15)
    for k in range(10):
        await s.send_frame(empty, ts=frames[-1][0] + (k + 1) / 10)
        await asyncio.sleep(0.1)


async def test_a_stream_with_a_vocabulary_sends_sign_captions_on_its_timeline(live: Live) -> None:
    """Frames of a rendered hand over a real WebSocket: the sign is found, recognised and translated."""
    from PIL import Image

    from lingua_fusion import MultimodalTranslator

    vid = live.a.post("/v1/vocabularies", json={"name": "live", "kind": "sign"}).json()["vocabulary_id"]
    for gloss, path in (("across", _line(16)), ("across", _line(24)), ("round", _circle(16)),
                        ("round", _circle(24))):
        r = live.a.post(f"/v1/vocabularies/{vid}/examples", data={"gloss": gloss},
                        files={"file": ("sign.mp4", _video(path), "video/mp4")})
        assert r.status_code == 201, r.text

    def png(rgb: np.ndarray) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="PNG")
        return buf.getvalue()

    empty = png(np.full((480, 640, 3), (60, 90, 120), np.uint8))
    frames = [(0.5 + i / 15, png(render_hand(p))) for i, p in enumerate(_line(20, y=0.8))]
    translator = MultimodalTranslator(api_key=live.a.headers["Authorization"][7:], base_url=live.url)
    events = []
    async with translator.stream(["es"], inputs=["video", "text"], vocabulary_id=vid, partials=False) as s:
        await s.send_text("Good morning.", ts=0.1)  # a typed caption beside the signs
        await _camera(s, empty, frames)
        await s.end()
        async for event in s:
            events.append(event)
    signs = [e for e in events if e.type == "sign"]
    assert [e.gloss for e in signs] == ["across"], [e.type for e in events]
    sign = signs[0]
    assert sign.modalities == ["sign"] and sign.translations["es"] and sign.text == sign.translations["es"]
    assert 0.4 <= sign.t <= 0.8 and 1.5 <= sign.end <= 1.9  # where the hand was, on the stream's clock
    assert 0 < sign.frames["analysed"] < sign.frames["decoded"]
    finals = [e for e in events if e.type == "final"]
    assert [f.modalities for f in finals] == [["text"]]  # each caption says what it was made from


async def test_an_in_process_stream_reads_signs_with_the_translators_own_vocabulary(tmp_path: Path) -> None:
    """``MultimodalTranslator.local()``: a vocabulary taught in-process is read by an in-process stream (before, the
    local translator handed its vocabularies to an attribute the stream service never read, and such a stream was
    refused: 'this server reads no signs')."""
    from PIL import Image

    from lingua_fusion import MultimodalTranslator
    from lingua_fusion.config import Settings

    settings = Settings()
    settings.state_dir = tmp_path
    translator = MultimodalTranslator.local(settings=settings)
    try:
        vid = str(translator.create_vocabulary("local", kind="sign")["vocabulary_id"])
        for gloss, path in (("across", _line(16)), ("across", _line(24)), ("round", _circle(16)),
                            ("round", _circle(24))):
            translator.add_example(vid, gloss, video=_video(path))

        def png(rgb: np.ndarray) -> bytes:
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, format="PNG")
            return buf.getvalue()

        empty = png(np.full((480, 640, 3), (60, 90, 120), np.uint8))
        frames = [(0.5 + i / 15, png(render_hand(p))) for i, p in enumerate(_line(20, y=0.8))]
        events = []
        async with translator.stream(["es"], inputs=["video"], vocabulary_id=vid, partials=False) as s:
            await _camera(s, empty, frames)
            await s.end()
            async for event in s:
                events.append(event)
        signs = [e for e in events if e.type == "sign"]
        assert [e.gloss for e in signs] == ["across"], [e.type for e in events]
        assert signs[0].translations["es"]
    finally:
        await translator.close_streams()
        translator.close()


async def test_a_stream_cannot_use_another_keys_vocabulary(live: Live) -> None:
    from lingua_fusion import MultimodalTranslator
    from lingua_fusion.errors import NotFound as NotFoundError

    vid = _teach(live.a, "not-yours", per_sign=1)
    other = MultimodalTranslator(api_key=live.b.headers["Authorization"][7:], base_url=live.url)
    with pytest.raises(NotFoundError):
        async with other.stream(["es"], inputs=["video"], vocabulary_id=vid):
            pass


# ---- large bodies: other clients keep being answered; a byte quota per key ---------------------------------------
def _random_frames(n: int, seed: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)

    def pts(k: int) -> list[list[float]]:
        return (0.3 + 0.4 * rng.random((k, 2))).round(5).tolist()

    return [{"t": round(i / 30, 4), "left_hand": pts(21), "right_hand": pts(21), "pose": pts(33)} for i in range(n)]


def test_other_clients_are_answered_while_the_server_reads_the_largest_vocabulary_body(live: Live) -> None:
    """A 16 MB example body (refused: 10,000+ frames) used to be parsed and checked on the event loop: for the
    seconds that took, no other request was answered. Now /healthz requests sent one after another from another
    client are answered while that body is read (counted between its upload and its answer; no timing)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    vid = live.a.post("/v1/vocabularies", json={"name": "big", "kind": "sign"}).json()["vocabulary_id"]
    frames = _random_frames(11_000, 4)
    body = json.dumps({"gloss": "big", "frames": frames}).encode()
    while len(body) > 16 * 1024 * 1024:
        frames = frames[:-200]
        body = json.dumps({"gloss": "big", "frames": frames}).encode()
    auth = live.a.headers["Authorization"]
    parts = urlsplit(live.url)
    head = (f"POST /v1/vocabularies/{vid}/examples HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: {auth}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    uploaded, answered = threading.Event(), threading.Event()
    during: list[int] = []

    def poll() -> None:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            uploaded.wait(60)
            while not answered.is_set():
                status = c.get("/healthz").status_code
                if not answered.is_set():
                    during.append(status)

    poller = threading.Thread(target=poll)
    poller.start()
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as s:
        s.sendall(head + body)
        uploaded.set()
        reply = s.recv(65536)
        answered.set()
    poller.join(60)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert len(during) >= 3 and set(during) == {200}, during


def test_a_keys_vocabularies_hold_at_most_max_vocabulary_bytes_per_key(tmp_path: Path) -> None:
    key = _key(tmp_path)
    url, proc = start_server(tmp_path, env={"LINGUAFUSION_VISION__MAX_VOCABULARY_BYTES_PER_KEY": "1500000"})
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            vid = c.post("/v1/vocabularies", json={"name": "q", "kind": "sign"}).json()["vocabulary_id"]
            example = {"gloss": "wave", "frames": _random_frames(300, 1)}  # about 0.43 MB stored
            added = [c.post(f"/v1/vocabularies/{vid}/examples", json=example) for _ in range(4)]
            assert [r.status_code for r in added] == [201, 201, 201, 403], added[-1].text
            error = added[-1].json()["error"]
            assert error["code"] == "quota_exceeded" and error["details"]["limit"] == "max_vocabulary_bytes_per_key"
            assert error["details"]["max"] == 1_500_000
            doc = c.get(f"/v1/vocabularies/{vid}/export").json()
            assert len(doc["examples"]) == 3 and doc["examples"][0]["frames"][0]["t"] == 0.0
            r = c.post("/v1/vocabularies/import", json=doc)  # another vocabulary, the same key: over the quota
            assert r.status_code == 403 and r.json()["error"]["code"] == "quota_exceeded"
            assert len(c.get("/v1/vocabularies").json()["vocabularies"]) == 1  # no empty vocabulary left behind
            c.delete(f"/v1/vocabularies/{vid}/examples/{added[0].json()['example_id']}")
            assert c.post(f"/v1/vocabularies/{vid}/examples", json=example).status_code == 201
    finally:
        stop_server(proc)


def test_an_import_waits_for_a_file_slot_like_any_file_request(tmp_path: Path) -> None:
    """Importing checks every example (features of each): work in the key's share of the file slots, so a flood of
    imports cannot take the threads other requests need. With one slot and no waiting room, an import while a long
    file translation holds the slot is refused 429 (before, it ran beside it)."""
    from test_shutdown import long_talk

    url, proc = start_server(tmp_path, "--no-auth", env={"LINGUAFUSION_SERVER__MAX_CONCURRENT_REQUESTS": "1",
                                                          "LINGUAFUSION_SERVER__MAX_WAITING_REQUESTS": "0"})
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            vid = c.post("/v1/vocabularies", json={"name": "q", "kind": "sign"}).json()["vocabulary_id"]
            c.post(f"/v1/vocabularies/{vid}/examples", json={"gloss": "wave", "frames": _random_frames(30, 1)})
            doc = c.get(f"/v1/vocabularies/{vid}/export").json()
            assert c.post("/v1/vocabularies/import", json=doc).status_code == 201  # a free slot: imported
            holder = threading.Thread(target=_post_quietly, args=(url, long_talk()), daemon=True)
            holder.start()  # 600 s of speech: it holds the only slot for the rest of the test
            for _ in range(600):  # until it has the slot, 60 s at most
                if "linguafusion_requests_in_flight 1.0" in c.get("/metrics").text:
                    break
                time.sleep(0.1)
            r = c.post("/v1/vocabularies/import", json=doc)
            assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded", r.text
            assert len(c.get("/v1/vocabularies").json()["vocabularies"]) == 2  # nothing imported the second time
    finally:
        stop_server(proc)


def _post_quietly(url: str, wav: bytes) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server is stopped under it
        httpx.post(url + "/v1/translate", files={"file": ("talk.wav", wav, "audio/wav")},
                   data={"target_lang": "es", "source_lang": "en"}, timeout=120)
