"""A file's speech cut into pieces of at most Whisper's window, each cut in the quietest moment near the window's
end, so that a piece is one engine work item (a stream's caption waits for one piece, not for the file) and no
word is cut in two. Pure: samples in, (start, end) sample ranges out."""

from __future__ import annotations

import numpy as np

RATE = 16000
MAX_S = 30.0  # Whisper's window: a piece is decoded in one pass
MIN_S = 20.0  # a cut is looked for in the last MAX_S - MIN_S seconds of a window
FRAME_S = 0.1  # the loudness is compared over frames of this length


def cuts(audio: np.ndarray, *, rate: int = RATE, max_s: float = MAX_S, min_s: float = MIN_S,
         frame_s: float = FRAME_S) -> list[tuple[int, int]]:
    """(start, end) sample ranges covering ``audio`` in order, each at most ``max_s`` long; a range shorter than
    ``max_s`` is left whole. Each cut is at the middle of the quietest ``frame_s`` frame between ``min_s`` and
    ``max_s`` after the range's start."""
    n, most, least, frame = len(audio), int(max_s * rate), int(min_s * rate), max(1, int(frame_s * rate))
    out: list[tuple[int, int]] = []
    start = 0
    while n - start > most:
        lo, hi = start + least, start + most
        span = audio[lo:hi]
        usable = len(span) // frame * frame
        energy = np.square(span[:usable].astype(np.float32)).reshape(-1, frame).mean(axis=1)
        cut = lo + int(np.argmin(energy)) * frame + frame // 2
        out.append((start, cut))
        start = cut
    out.append((start, n))
    return out
