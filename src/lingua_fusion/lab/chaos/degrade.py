"""Controlled, seeded degradations of inputs. The same functions serve the degradation study (eval) and the chaos
experiments: write them once. Every function is deterministic for a given ``seed``.

Audio is 16 kHz mono float32; images are RGB uint8 arrays.
"""

from __future__ import annotations

import numpy as np

from ...types import SR


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def add_noise(audio: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """White noise at a signal-to-noise ratio (dB) measured against the clip's own power."""
    power = float(np.mean(audio.astype(np.float64) ** 2)) or 1e-12
    noise = rng(seed).standard_normal(len(audio)) * np.sqrt(power / (10 ** (snr_db / 10)))
    return np.clip(audio + noise, -1.0, 1.0).astype(np.float32)


def dropouts(audio: np.ndarray, per_second: float, min_ms: float = 120, max_ms: float = 480,
             seed: int = 0) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """ASR input gaps: a Poisson process of ``per_second`` gaps, each 120-480 ms of silence. Returns the gaps too."""
    r = rng(seed)
    out = audio.copy()
    gaps: list[tuple[float, float]] = []
    t = 0.0
    dur = len(audio) / SR
    while per_second > 0:
        t += r.exponential(1.0 / per_second)
        if t >= dur:
            break
        length = r.uniform(min_ms, max_ms) / 1000
        a, b = int(t * SR), min(len(out), int((t + length) * SR))
        out[a:b] = 0.0
        gaps.append((round(t, 3), round(min(dur, t + length), 3)))
        t += length
    return out, gaps


def drop_mask(n: int, probability: float, seed: int = 0) -> np.ndarray:
    """Which of ``n`` frames/chunks survive when each is dropped independently (a Bernoulli thinning of a Poisson
    stream: camera frame drops of 5-25 %)."""
    return rng(seed).random(n) >= probability


def jitter(n: int, std_ms: float, seed: int = 0) -> np.ndarray:
    """Per-packet extra delays (s), |normal| with the given standard deviation: network jitter."""
    return np.abs(rng(seed).normal(0.0, std_ms / 1000, n))


def blur(image: np.ndarray, radius: float) -> np.ndarray:
    from PIL import Image, ImageFilter

    if radius <= 0:
        return image
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius)))


def offset(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """Shift the picture (what a moved camera does to a slide), filling with white."""
    out = np.full_like(image, 255)
    h, w = image.shape[:2]
    xs, xd = (0, dx) if dx >= 0 else (-dx, 0)
    ys, yd = (0, dy) if dy >= 0 else (-dy, 0)
    cw, ch = w - abs(dx), h - abs(dy)
    if cw > 0 and ch > 0:
        out[yd:yd + ch, xd:xd + cw] = image[ys:ys + ch, xs:xs + cw]
    return out


# name -> (path it affects, levels, a label for the axis); level 0 / None means clean
STUDIES: dict[str, tuple[str, list[float], str]] = {
    "noise": ("speech", [99.0, 30.0, 20.0, 10.0, 5.0, 0.0], "SNR (dB, 99 = clean)"),
    "dropout": ("speech", [0.0, 0.5, 1.0, 2.0, 3.0], "gaps of 120-480 ms per second"),
    "blur": ("slides", [0.0, 1.0, 2.0, 3.0, 4.0, 6.0], "Gaussian blur radius (px)"),
    "offset": ("slides", [0.0, 100.0, 300.0, 500.0, 700.0], "slide shifted left (px)"),
}


def apply(study: str, level: float, *, audio: np.ndarray | None = None, image: np.ndarray | None = None,
          seed: int = 0) -> np.ndarray:
    if study == "noise":
        assert audio is not None
        return audio if level >= 99 else add_noise(audio, level, seed)
    if study == "dropout":
        assert audio is not None
        return dropouts(audio, level, seed=seed)[0]
    if study == "blur":
        assert image is not None
        return blur(image, level)
    if study == "offset":
        assert image is not None
        return offset(image, -int(level), 0)
    raise ValueError(f"unknown degradation {study}; one of {sorted(STUDIES)}")
