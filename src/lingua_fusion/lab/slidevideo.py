"""Test videos of slides whose text changes at known times (the slide tests and bench/slides.py make their own).

``slide_video`` renders each slide with PIL (a title and lines of text), shows them from their start times, and
encodes an mp4 (H.264 + AAC) or a webm (VP8 + Opus) with PyAV, with optional speech as the audio track and the
nuisances a real recording has: fades between slides, a moving mouse cursor, camera noise, brightness flicker.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
FONT_BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"


@dataclass(frozen=True)
class SlideSpec:
    t: float  # when the slide appears (seconds)
    title: str
    lines: tuple[str, ...] = ()
    blank: bool = False  # an empty (white) picture instead of a slide


@dataclass(frozen=True)
class Nuisance:
    fade_s: float = 0.0  # cross-fade length into each slide (starting at its t)
    cursor: bool = False  # a mouse pointer that wanders a little all the time
    noise: float = 0.0  # camera noise: std of Gaussian noise per pixel (grey levels)
    flicker: float = 0.0  # auto-exposure flicker: brightness shift amplitude (grey levels)
    webcam: bool = False  # a picture-in-picture speaker inset (bottom right) that moves all the time


def _font(path: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from PIL import ImageFont

    return ImageFont.truetype(path, size) if Path(path).exists() else ImageFont.load_default()


def render_slide(spec: SlideSpec, size: tuple[int, int] = (960, 540)) -> np.ndarray:
    from PIL import Image, ImageDraw

    w, h = size
    img = Image.new("RGB", size, "white")
    if not spec.blank:
        draw = ImageDraw.Draw(img)
        draw.text((int(w * 0.06), int(h * 0.08)), spec.title, fill=(10, 30, 90), font=_font(FONT_BOLD, h // 11))
        y = int(h * 0.30)
        for line in spec.lines:
            draw.text((int(w * 0.08), y), line, fill="black", font=_font(FONT, h // 17))
            y += int(h * 0.11)
    return np.asarray(img, dtype=np.uint8).copy()


def _cursor(frame: np.ndarray, x: int, y: int) -> None:
    """A 14 x 20 black arrow with a white edge at (x, y)."""
    for dy in range(20):
        width = min(dy // 2 + 1, 10)
        row = frame[y + dy:y + dy + 1, x:x + width + 2]
        row[...] = 255
        frame[y + dy:y + dy + 1, x + 1:x + 1 + width] = 0


def _webcam(frame: np.ndarray, t: float, rng: np.random.Generator) -> None:
    """A speaker inset: a dark backdrop, a head that sways and nods, a noisy sensor."""
    h, w = frame.shape[:2]
    bw, bh = w // 5, h // 5
    y0, x0 = h - bh - 8, w - bw - 8
    box = np.full((bh, bw, 3), 60, np.float32) + rng.normal(0, 6, (bh, bw, 3))
    cx = bw / 2 + bw * 0.2 * np.sin(2 * np.pi * 0.6 * t)
    cy = bh / 2 + bh * 0.1 * np.sin(2 * np.pi * 1.3 * t)
    yy, xx = np.mgrid[0:bh, 0:bw]
    head = ((xx - cx) / (bw * 0.18)) ** 2 + ((yy - cy) / (bh * 0.3)) ** 2 <= 1
    box[head] = (200, 160, 130)
    frame[y0:y0 + bh, x0:x0 + bw] = np.clip(box, 0, 255).astype(np.uint8)


def frames_at(slides: list[SlideSpec], duration: float, fps: float, size: tuple[int, int], nuisance: Nuisance,
              seed: int = 0) -> list[tuple[float, np.ndarray]]:
    rng = np.random.default_rng(seed)
    pics = [render_slide(s, size) for s in slides]
    out = []
    cx, cy = size[0] // 2, size[1] // 2
    for i in range(int(round(duration * fps))):
        t = i / fps
        k = max((j for j, s in enumerate(slides) if s.t <= t + 1e-9), default=0)
        frame = pics[k].astype(np.float32)
        if nuisance.fade_s > 0 and k > 0 and t < slides[k].t + nuisance.fade_s:
            a = (t - slides[k].t) / nuisance.fade_s
            frame = (1 - a) * pics[k - 1].astype(np.float32) + a * frame
        if nuisance.flicker:
            frame += nuisance.flicker * np.sin(2 * np.pi * 0.7 * t)
        if nuisance.noise:
            frame += rng.normal(0, nuisance.noise, frame.shape).astype(np.float32)
        img = np.clip(frame, 0, 255).astype(np.uint8)
        if nuisance.webcam:
            _webcam(img, t, rng)
        if nuisance.cursor:
            cx = int(np.clip(cx + rng.integers(-6, 7), 0, size[0] - 16))
            cy = int(np.clip(cy + rng.integers(-6, 7), 0, size[1] - 22))
            _cursor(img, cx, cy)
        out.append((t, img))
    return out


def slide_video(slides: list[SlideSpec], duration: float, *, speech: tuple[np.ndarray, int] | None = None,
                fps: float = 10.0, size: tuple[int, int] = (960, 540), nuisance: Nuisance = Nuisance(),
                container: str = "mp4", seed: int = 0) -> bytes:
    """An encoded video of ``slides`` lasting ``duration`` s. ``speech``: (mono samples, rate) for the audio track
    (int16 or float in [-1, 1]), padded with silence or cut to ``duration``."""
    import av

    vcodec, acodec, arate = ("libx264", "aac", 16000) if container == "mp4" else ("libvpx", "libopus", 48000)
    buf = io.BytesIO()
    out = av.open(buf, mode="w", format=container)
    vs = out.add_stream(vcodec, rate=int(fps))
    assert isinstance(vs, av.VideoStream)  # the codec is a video one (its name is not a literal the stubs know)
    vs.width, vs.height, vs.pix_fmt = size[0], size[1], "yuv420p"
    if vcodec == "libx264":
        vs.options = {"preset": "ultrafast", "crf": "23"}
    aus: av.AudioStream | None = None
    if speech is not None:
        audio = out.add_stream(acodec, rate=arate)
        assert isinstance(audio, av.AudioStream)  # the codec is an audio one
        aus = audio
        aus.layout = "mono"
    for _t, img in frames_at(slides, duration, fps, size, nuisance, seed):
        for packet in vs.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            out.mux(packet)
    for packet in vs.encode(None):
        out.mux(packet)
    if aus is not None and speech is not None:
        pcm, rate = speech
        x = pcm.astype(np.float32) / (32768.0 if pcm.dtype == np.int16 else 1.0)
        n = int(duration * rate)
        x = np.pad(x, (0, max(0, n - x.size)))[:n]
        src = av.AudioFrame.from_ndarray((x * 32767).astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        src.sample_rate = rate
        resampler = av.AudioResampler(format=aus.format.name, layout="mono", rate=arate)
        for f in resampler.resample(src) + resampler.resample(None):
            for packet in aus.encode(f):
                out.mux(packet)
        for packet in aus.encode(None):
            out.mux(packet)
    out.close()
    return buf.getvalue()


def speech_track(parts: list[tuple[float, np.ndarray, int]], rate: int = 16000) -> tuple[np.ndarray, int]:
    """Clips placed at their start times on one track: [(start_s, samples, their rate)] -> (samples, rate)."""
    end = 0
    placed = []
    for start, pcm, sr in parts:
        x = pcm.astype(np.float32) / (32768.0 if pcm.dtype == np.int16 else 1.0)
        if sr != rate:
            x = _resample(x, sr, rate)
        i = int(start * rate)
        placed.append((i, x))
        end = max(end, i + x.size)
    track = np.zeros(end, dtype=np.float32)
    for i, x in placed:
        track[i:i + x.size] += x
    return track, rate


def _resample(x: np.ndarray, sr: int, rate: int) -> np.ndarray:
    import av

    frame = av.AudioFrame.from_ndarray(x.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = sr
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    outs = resampler.resample(frame) + resampler.resample(None)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in outs]).astype(np.float32)
