"""A video file's signs read with the key's sign vocabulary, over REST and the CLI on a real server: the real
mediapipe worker reads a video rendered with the test hand renderer (a hand moving right, then down), the
signs come back on the result's timeline beside segments and slides, each gloss translated; bad vocabularies are
4xx with codes, and the CLI says ``error [code]`` with exit 2."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import BIN, start_server, stop_server

from lingua_fusion.vision.synthetic import render_hand

PORT = 18514
FPS = 15
BACKGROUND = (60, 90, 120)  # render_hand's

pytestmark = pytest.mark.timeout(300)


def _line(n: int, y: float = 0.75) -> list[tuple[float, float]]:
    return [(0.3 + 0.4 * i / (n - 1), y) for i in range(n)]


def _down(n: int, x: float = 0.4) -> list[tuple[float, float]]:
    return [(x, 0.65 + 0.2 * i / (n - 1)) for i in range(n)]


def _video(shots: list[tuple[float, float] | None]) -> bytes:
    """An H.264 video at 15 fps: a rendered hand where a shot has a wrist position, the empty background where not."""
    import av

    empty = np.full((480, 640, 3), BACKGROUND, np.uint8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        for p in shots:
            rgb = render_hand(p) if p is not None else empty
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


@dataclass
class Live:
    url: str
    key: str
    other: str
    vocabulary_id: str
    lips_id: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    state = tmp_path_factory.mktemp("file-signs-state")

    def key() -> str:
        return subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    k, other = key(), key()
    url, proc = start_server(state, port=PORT)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {k}"}, timeout=120) as c:
            vid = c.post("/v1/vocabularies", json={"name": "signs", "kind": "sign"}).json()["vocabulary_id"]
            for gloss, path in (("across", _line(16)), ("across", _line(24)), ("down", _down(16)),
                                ("down", _down(24))):
                r = c.post(f"/v1/vocabularies/{vid}/examples", data={"gloss": gloss},
                           files={"file": ("sign.mp4", _video(list(path)), "video/mp4")})
                assert r.status_code == 201, r.text
            lips = c.post("/v1/vocabularies", json={"name": "lips", "kind": "lip"}).json()["vocabulary_id"]
        yield Live(url, k, other, vid, lips)
    finally:
        stop_server(proc)


def _talk() -> bytes:
    """Rest, "across" (performed lower and slower than taught), rest, "down" (faster, elsewhere), rest: 4 s."""
    rest: list[tuple[float, float] | None] = [None] * 12
    return _video(rest + list(_line(20, y=0.8)) + rest + list(_down(14, x=0.45)) + rest)


def test_a_videos_signs_are_on_the_rest_results_timeline_translated(live: Live) -> None:
    r = httpx.post(f"{live.url}/v1/translate", headers={"Authorization": f"Bearer {live.key}"}, timeout=300,
                   data={"target_lang": "es", "vocabulary_id": live.vocabulary_id},
                   files={"file": ("signs.mp4", _talk(), "video/mp4")})
    assert r.status_code == 200, r.text
    body = r.json()
    signs = body["signs"]
    assert [s["gloss"] for s in signs] == ["across", "down"], signs
    across, down = signs
    assert 0.6 <= across["start"] <= 1.0 and 1.9 <= across["end"] <= 2.3  # frames 12-31 at 15 fps
    assert 2.7 <= down["start"] <= 3.1 and 3.5 <= down["end"] <= 3.9  # frames 44-57
    assert across["source_text"] == "across" and across["text"] and across["text"] != "across"  # translated
    assert all(0 < s["confidence"] <= 1 for s in signs)
    assert body["segments"] == [] and "slides" in body  # no audio track: the signs are what it says
    assert body["text"].split("\n\n") == [s["text"] for s in signs]  # one per sign, as slides are


def test_the_cli_reads_a_videos_signs_with_vocabulary(live: Live, tmp_path: Path) -> None:
    video = tmp_path / "signs.mp4"
    video.write_bytes(_talk())
    out = subprocess.run([str(BIN), "translate", str(video), "--to", "es", "--json", "--vocabulary",
                          live.vocabulary_id, "--url", live.url, "--api-key", live.key],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [s["gloss"] for s in json.loads(out.stdout)["signs"]] == ["across", "down"]
    bad = subprocess.run([str(BIN), "translate", str(video), "--to", "es", "--vocabulary", live.vocabulary_id,
                          "--url", live.url, "--api-key", live.other], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error [not_found]"), bad.stderr  # another key's


def test_a_vocabulary_that_cannot_read_signs_is_refused_with_a_code(live: Live) -> None:
    def post(vid: str) -> httpx.Response:
        return httpx.post(f"{live.url}/v1/translate", headers={"Authorization": f"Bearer {live.key}"},
                          data={"target_lang": "es", "vocabulary_id": vid}, timeout=60,
                          files={"file": ("x.mp4", b"\x00" * 64, "video/mp4")})

    r = post(live.lips_id)  # a lip vocabulary (and untaught)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter"
    assert "lip" in r.json()["error"]["message"]
    r = post("vo_000000000000")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.post(f"{live.url}/v1/translate", headers={"Authorization": f"Bearer {live.key}"}, timeout=60,
                   data={"target_lang": "es", "source_lang": "en", "text": "Good morning.",
                         "vocabulary_id": live.vocabulary_id})
    assert r.status_code == 200, r.text
    assert r.json()["signs"] == []  # text has no frames: said so, not ignored silently
    assert any("vocabulary_id" in w for w in r.json()["warnings"])
