"""Which part of a stretch of audio is voice (pure numpy): quiet 30 ms frames (pauses, breaths) left out, so that a
speaker embedding hears the voice and not the room. Shared by files' diarization (files/diarize.py) and streams'
(stream/speakers.py)."""

from __future__ import annotations

import numpy as np

FRAME = 480  # 30 ms at 16 kHz: the unit of the quiet-frame cut
QUIET = 0.05  # a frame under this share of the stretch's loud frames' RMS is quiet


def frame_rms(audio: np.ndarray) -> np.ndarray:
    n = len(audio) // FRAME
    return np.sqrt(np.mean(audio[:n * FRAME].reshape(n, FRAME).astype(np.float64) ** 2, axis=1))


def voiced(audio: np.ndarray) -> np.ndarray:
    """``audio`` without its quiet 30 ms frames (pauses, breaths): what is left is the voice."""
    rms = frame_rms(audio)
    if len(rms) < 2:
        return audio
    loud = float(np.percentile(rms, 90))
    if loud <= 1e-4:
        return audio[:0]
    n = len(rms)
    return audio[:n * FRAME].reshape(n, FRAME)[rms >= QUIET * loud].reshape(-1)
