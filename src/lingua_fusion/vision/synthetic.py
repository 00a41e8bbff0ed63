"""Synthetic landmark sequences for tests and benchmarks: signs (a hand shape and a movement per gloss) and lip
words (a sequence of mouth shapes per word), performed with the variations a real signer or speaker brings:
position and distance from the camera, speed (overall and uneven), tremor / detector noise, the other hand
(mirrored: a left-handed signer), and frames where the detector lost the hand.

A vocabulary is drawn from a seed, so a test can teach examples of gloss k and query other performances of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .landmarks import HAND_POINTS, LEFT, LIP_POINTS, POSE_POINTS, RIGHT, LandmarkFrame, LandmarkSeq

# a right hand, palm towards the camera, fingers up: per finger (knuckle x, knuckle y, direction) in palm lengths
_FINGERS = ((-0.45, -0.35, -0.9), (-0.25, -1.0, -0.15), (0.0, -1.0, 0.0), (0.22, -0.95, 0.12), (0.42, -0.85, 0.25))
_SEGMENTS = ((0.35, 0.3, 0.25), (0.4, 0.25, 0.2), (0.45, 0.28, 0.2), (0.4, 0.25, 0.2), (0.32, 0.2, 0.18))


def hand_points(curl: np.ndarray, angle: float) -> np.ndarray:
    """21 x 2 points of a right hand with palm length 1, wrist at the origin; ``curl`` 5 values in [0, 1]
    (0 straight, 1 a fist), ``angle`` the in-plane rotation (radians)."""
    pts = np.zeros((HAND_POINTS, 2))
    for f, ((kx, ky, direction), segs) in enumerate(zip(_FINGERS, _SEGMENTS, strict=True)):
        pos = np.array([kx, ky])
        pts[1 + 4 * f] = pos  # the knuckle (the thumb's: its base joint)
        heading = -np.pi / 2 + direction
        for j, length in enumerate(segs):
            heading += curl[f] * (1.3 if f else 0.8)
            pos = pos + length * np.array([np.cos(heading), np.sin(heading)])
            pts[2 + 4 * f + j] = pos
    c, s = np.cos(angle), np.sin(angle)
    return pts @ np.array([[c, s], [-s, c]])


@dataclass(frozen=True)
class SignSpec:
    gloss: str
    path: np.ndarray  # 2 x 2 x 2: per axis, sine amplitudes and phases (harmonics 1, 2) of the wrist's path
    drift: np.ndarray  # 2: a straight movement over the sign
    curl_start: np.ndarray
    curl_end: np.ndarray
    angle: tuple[float, float]
    two_handed: bool


@dataclass(frozen=True)
class Performance:
    """How one performance varies: noise (image units), speed (duration, s), unevenness (time-warp exponent),
    mirrored (performed by the left hand), drop (share of frames whose hand the detector lost)."""

    duration: float = 1.0
    warp: float = 1.0
    noise: float = 0.003
    mirrored: bool = False
    drop: float = 0.0
    scale: float = 1.0
    offset: tuple[float, float] = (0.0, 0.0)
    fps: float = 30.0


def sign_vocabulary(size: int, seed: int = 0) -> list[SignSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(size):
        amp = rng.uniform(0.3, 1.6, (2, 2)) * rng.choice([-1, 1], (2, 2))
        phase = rng.uniform(0, 2 * np.pi, (2, 2))
        out.append(SignSpec(f"SIGN{k}", np.stack([amp, phase], axis=-1), rng.uniform(-1.5, 1.5, 2),
                            rng.uniform(0, 1, 5), rng.uniform(0, 1, 5),
                            (float(rng.uniform(-0.6, 0.6)), float(rng.uniform(-0.6, 0.6))), bool(rng.random() < 0.3)))
    return out


def random_performance(rng: np.random.Generator, *, mirrored: bool | None = None, noise: float = 0.003,
                       drop: float = 0.03) -> Performance:
    return Performance(duration=float(rng.uniform(0.6, 1.8)), warp=float(np.exp(rng.uniform(-0.35, 0.35))),
                       noise=noise, mirrored=bool(rng.random() < 0.3) if mirrored is None else mirrored, drop=drop,
                       scale=float(rng.uniform(0.7, 1.4)),
                       offset=(float(rng.uniform(-0.1, 0.1)), float(rng.uniform(-0.1, 0.1))))


def perform_sign(spec: SignSpec, perf: Performance, rng: np.random.Generator, t0: float = 0.0) -> LandmarkSeq:
    n = max(3, int(round(perf.duration * perf.fps)))
    u = np.linspace(0.0, 1.0, n) ** perf.warp  # uneven speed: faster at the start or at the end
    palm = 0.07 * perf.scale
    frames = []
    for i, s in enumerate(u):
        body = np.array([0.5 + perf.offset[0], 0.55 + perf.offset[1]])
        move = palm * _path(spec, s)
        wrist = body + move
        curl = spec.curl_start + (spec.curl_end - spec.curl_start) * s
        angle = spec.angle[0] + (spec.angle[1] - spec.angle[0]) * s
        hands = np.zeros((2, HAND_POINTS, 2))
        present = [False, False]
        hands[RIGHT] = wrist + palm * hand_points(curl, angle)
        present[RIGHT] = True
        if spec.two_handed:  # the other hand mirrors half the movement across the body's midline
            other = body + np.array([-4 * palm - 0.5 * move[0], 0.5 * move[1]])
            flipped = hand_points(curl[::-1], -angle) * np.array([-1.0, 1.0])
            hands[LEFT] = other + palm * flipped
            present[LEFT] = True
        if perf.mirrored:  # a left-handed signer: the image mirrored, the hands' labels swapped
            hands = hands[::-1].copy()
            hands[..., 0] = 1.0 - hands[..., 0]
            present = present[::-1]
        hands += rng.normal(0.0, perf.noise, hands.shape)
        if i not in (0, n - 1) and rng.random() < perf.drop:
            present = [False, False]
        hands[~np.array(present)] = 0.0
        frames.append(LandmarkFrame(t0 + i / perf.fps, hands.astype(np.float32), (present[0], present[1]),
                                    np.zeros((POSE_POINTS, 2), np.float32), False,
                                    np.zeros((LIP_POINTS, 2), np.float32), False))
    return LandmarkSeq.from_frames(frames)


def _path(spec: SignSpec, s: float) -> np.ndarray:
    out = spec.drift * s
    for axis in range(2):
        for h in range(2):
            amp, phase = spec.path[axis, h]
            out[axis] += amp * (np.sin(2 * np.pi * (h + 1) * s * 0.5 + phase) - np.sin(phase))
    return out


# ---- lips ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LipSpec:
    gloss: str
    shapes: np.ndarray  # K x 2: (opening, width) targets the mouth passes through


def lip_vocabulary(words: list[str], seed: int = 0) -> list[LipSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for w in words:
        k = int(rng.integers(3, 6))
        shapes = np.stack([rng.uniform(0.0, 0.6, k), rng.uniform(0.7, 1.3, k)], axis=1)
        shapes[0] = shapes[-1] = (0.05, 1.0)  # rest before and after
        out.append(LipSpec(w, shapes))
    return out


def lip_points(opening: float, width: float) -> np.ndarray:
    """40 x 2 lip points in LIP_INDICES order, mouth width ``width`` (the corners at x = -w/2, w/2)."""
    # outer: corner 61, 10 points along the lower lip to corner 291, then 9 back along the upper lip
    lower = np.linspace(np.pi, 0.0, 11)  # 61 ... 291
    upper = np.linspace(np.pi * 0.1, np.pi * 0.9, 9)[::-1]
    half = width / 2
    outer = [(half * np.cos(a), 0.12 + (0.18 + opening * 0.6) * np.sin(a)) for a in lower]
    outer += [(half * np.cos(a), -0.15 - (0.05 + opening * 0.3) * np.sin(a)) for a in upper]
    inner_lower = np.linspace(np.pi, 0.0, 11)
    inner_upper = np.linspace(np.pi * 0.1, np.pi * 0.9, 9)[::-1]
    ih = half * 0.8
    inner = [(ih * np.cos(a), (0.02 + opening * 0.5) * np.sin(a)) for a in inner_lower]
    inner += [(ih * np.cos(a), -(0.02 + opening * 0.1) * np.sin(a)) for a in inner_upper]
    return np.array(outer + inner)


def perform_lips(spec: LipSpec, perf: Performance, rng: np.random.Generator, t0: float = 0.0) -> LandmarkSeq:
    n = max(3, int(round(perf.duration * perf.fps)))
    u = np.linspace(0.0, 1.0, n) ** perf.warp
    knots = np.linspace(0.0, 1.0, len(spec.shapes))
    mouth = 0.08 * perf.scale
    centre = np.array([0.5 + perf.offset[0], 0.6 + perf.offset[1]])
    roll = float(rng.uniform(-0.15, 0.15))
    c, s = np.cos(roll), np.sin(roll)
    frames = []
    for i, x in enumerate(u):
        opening = float(np.interp(x, knots, spec.shapes[:, 0]))
        width = float(np.interp(x, knots, spec.shapes[:, 1]))
        pts = lip_points(opening, width) @ np.array([[c, s], [-s, c]])
        lips = centre + mouth * pts + rng.normal(0.0, perf.noise, (LIP_POINTS, 2))
        present = not (i not in (0, n - 1) and rng.random() < perf.drop)
        frames.append(LandmarkFrame(t0 + i / perf.fps, np.zeros((2, HAND_POINTS, 2), np.float32), (False, False),
                                    np.zeros((POSE_POINTS, 2), np.float32), False,
                                    lips.astype(np.float32) if present else np.zeros((LIP_POINTS, 2), np.float32),
                                    present))
    return LandmarkSeq.from_frames(frames)


# ---- rendered frames (for a real extractor) -------------------------------------------------------------------
def render_hand(wrist: tuple[float, float], *, curl: float = 0.05, angle: float = 0.0,
                size: tuple[int, int] = (640, 480), palm_px: float = 90.0, finger_px: int = 24) -> np.ndarray:
    """An RGB frame (H x W x 3 uint8) of a flat-shaded open hand and forearm on a plain background, wrist at
    ``wrist`` (fractions of width and height). mediapipe's palm detector finds this drawing in most frames at
    these proportions (640 x 480, fingers ~0.27 palm lengths thick); other proportions it often misses."""
    from PIL import Image, ImageDraw, ImageFilter

    w, h = size
    skin = (224, 172, 140)
    im = Image.new("RGB", size, (60, 90, 120))
    d = ImageDraw.Draw(im)
    pts = hand_points(np.full(5, curl), angle) * palm_px + np.array([wrist[0] * w, wrist[1] * h])
    d.polygon([tuple(pts[i]) for i in (0, 1, 5, 9, 13, 17)], fill=skin)
    r = finger_px / 2
    for f in range(5):
        chain = [0, 1, 2, 3, 4] if f == 0 else [1 + 4 * f + j for j in range(4)]
        for a, b in zip(chain[:-1], chain[1:], strict=True):
            d.line([tuple(pts[a]), tuple(pts[b])], fill=skin, width=finger_px)
        for i in chain:
            d.ellipse([pts[i][0] - r, pts[i][1] - r, pts[i][0] + r, pts[i][1] + r], fill=skin)
    d.rectangle([pts[0][0] - 0.6 * palm_px, pts[0][1], pts[0][0] + 0.6 * palm_px, h], fill=skin)
    return np.asarray(im.filter(ImageFilter.GaussianBlur(2)))
