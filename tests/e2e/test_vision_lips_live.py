"""Lips fused with speech in a real WebSocket stream on a real server, the real mediapipe worker reading real frames:
Grace Hopper's portrait (shipped inside matplotlib) whose mouth opens and closes in two patterns, taught as two lip
words from uploaded videos. Piper speaks; the stream's captions say which modalities made them: speech confirmed by
the lips, the lips alone while the audio is silent, and speech alone once the camera is gone."""

from __future__ import annotations

import asyncio
import io
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import matplotlib
import numpy as np
import pytest
from conftest import BIN, start_server, stop_server, talk_wav
from PIL import Image, ImageDraw

from lingua_fusion.vision.extractor import MediapipeExtractor

PORT = 18513
FPS = 15
PORTRAIT = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
# the mouth's opening (pixels) frame by frame at 15 fps: "stop" opens once, wide; "yes" twice
STOP = [0, 0, 8, 16, 24, 30, 30, 30, 24, 16, 8, 0, 0]
YES = [0, 0, 12, 24, 12, 2, 12, 24, 12, 0, 0]

pytestmark = pytest.mark.timeout(300)


class Face:
    def __init__(self) -> None:
        self.img = np.asarray(Image.open(PORTRAIT).convert("RGB"))
        ex = MediapipeExtractor(session="lips-live-test")
        try:
            lips = ex.extract([(0.0, self.img)], parts=frozenset({"lips"}))[0]
        finally:
            ex.close()
        assert lips.lips_present
        px = lips.lips * max(self.img.shape[:2])
        self.centre = px.mean(axis=0)
        self.width = float(px[10, 0] - px[0, 0])

    def frame(self, open_px: float) -> np.ndarray:
        im = Image.fromarray(self.img.copy())
        if open_px > 0:  # the mouth opened: a dark ellipse between the lips
            cx, cy = self.centre
            w = self.width * 0.38
            ImageDraw.Draw(im).ellipse([cx - w, cy - open_px / 2, cx + w, cy + open_px / 2], fill=(40, 10, 10))
        return np.asarray(im)

    def jpeg(self, open_px: float) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(self.frame(open_px)).save(buf, format="JPEG", quality=90)
        return buf.getvalue()

    def video(self, pattern: list[float]) -> bytes:
        import av

        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4") as out:
            stream = out.add_stream("libx264", rate=FPS)
            stream.width, stream.height, stream.pix_fmt = 512, 600, "yuv420p"
            for o in pattern:
                for packet in stream.encode(av.VideoFrame.from_ndarray(self.frame(o), format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        return buf.getvalue()


def slower(pattern: list[float], factor: float) -> list[float]:
    n = max(3, round(len(pattern) * factor))
    return np.interp(np.linspace(0, len(pattern) - 1, n), np.arange(len(pattern)), pattern).tolist()


@dataclass
class Live:
    url: str
    key: str
    vocabulary_id: str
    face: Face


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A server, a key, and its lip vocabulary taught from four videos of the portrait (two per word)."""
    state = tmp_path_factory.mktemp("lips-state")
    key = subprocess.run([str(BIN), "keys", "create", "--state-dir", str(state)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    url, proc = start_server(state, port=PORT)
    face = Face()
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
            vid = client.post("/v1/vocabularies", json={"name": "lips", "kind": "lip"}).json()["vocabulary_id"]
            for gloss, pattern in (("stop", STOP), ("stop", slower(STOP, 1.4)), ("yes", YES),
                                   ("yes", slower(YES, 1.4))):
                r = client.post(f"/v1/vocabularies/{vid}/examples", data={"gloss": gloss},
                                files={"file": ("lips.mp4", face.video(pattern), "video/mp4")})
                assert r.status_code == 201, r.text
        yield Live(url, key, vid, face)
    finally:
        stop_server(proc)


def pcm16(text: str) -> np.ndarray:
    from lingua_fusion.config import LimitSettings
    from lingua_fusion.media import decode_audio

    audio, _ = decode_audio(talk_wav([text], pause_s=0.2), LimitSettings())
    return (np.clip(audio, -1, 1) * 32767).astype("<i2")


async def test_captions_say_whether_speech_lips_or_both_made_them(live: Live) -> None:
    from lingua_fusion import MultimodalTranslator

    url, key, vid, face = live.url, live.key, live.vocabulary_id, live.face
    # one timeline at 15 ticks a second: audio (16 kHz PCM) and, while the camera is on, a frame per tick
    speech = pcm16("Please stop.")
    later = pcm16("Thank you very much.")
    rest = 1.0  # seconds of silence before the speech
    n_speech = len(speech) / 16000
    audio = np.concatenate([np.zeros(int(rest * 16000), "<i2"), speech, np.zeros(int(4.0 * 16000), "<i2"), later,
                            np.zeros(int(1.5 * 16000), "<i2")])
    mouth: dict[int, float] = {}
    first = int((rest + n_speech / 2) * FPS) - len(STOP) // 2  # "stop" mouthed in the middle of the speech
    mouth.update({first + i: o for i, o in enumerate(STOP)})
    yes_at = int((rest + n_speech + 1.2) * FPS)  # "yes" mouthed in the silence after it, the audio still coming
    mouth.update({yes_at + i: o for i, o in enumerate(YES)})
    camera_off = int((rest + n_speech + 3.5) * FPS)  # the camera goes before the second sentence
    frames = {o: face.jpeg(o) for o in set(mouth.values()) | {0}}
    step = 16000 // FPS

    events = []
    translator = MultimodalTranslator(api_key=key, base_url=url)
    async with translator.stream(["es"], inputs=["audio", "video"], vocabulary_id=vid, partials=False) as s:
        for k in range(len(audio) // step):
            t = k / FPS
            await s.send_audio(audio[k * step:(k + 1) * step].tobytes(), ts=t)
            if k < camera_off:
                await s.send_frame(frames[mouth.get(k, 0)], ts=t)
            await asyncio.sleep(1 / FPS)
        await s.end()
        async for event in s:
            events.append(event)
    errors = [e for e in events if e.type == "error"]
    assert not errors, errors
    finals = [e for e in events if e.type == "final"]
    made = [(f.source_text.strip(" .").lower(), f.modalities) for f in finals]
    assert made[0] == ("please stop", ["audio", "lips"]), made  # the lips saw "stop" while it was said
    assert made[1] == ("yes", ["lips"]), made  # mouthed in silence: the lips alone
    assert made[1][0] and finals[1].translations["es"].strip(" .").lower() in {"sí", "si"}
    assert rest + n_speech < finals[1].start < finals[1].end < rest + n_speech + 3.0  # where the mouth moved
    assert made[2][1] == ["audio"] and "thank you" in made[2][0], made  # the camera gone: speech alone, no error
    assert [f.seq for f in finals] == [1, 2, 3]
    video = next(e for e in events if e.type == "closed").video
    assert video["frames"] == camera_off
