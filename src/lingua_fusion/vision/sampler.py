"""Adaptive frame sampling (pure; the clock is the frames' media time): which decoded frames get the landmark
extractor.

Two motion signals: the mean absolute difference between successive decoded frames, downscaled to a small grey
thumbnail (cheap, on every frame), and the hands' speed between the last two analysed frames (palm lengths per
second, from the extractor's output). Their maximum, against ``still`` and ``moving`` thresholds, sets the
analysis rate between ``min_fps`` and ``max_fps``: high while the hands move, low when the picture is still. On top,
a token bucket holds the stream to its frame budget (``budget_fps`` on average, ``burst`` frames at once), as
granted by whoever runs the streams; a frame wanted while the bucket is empty is skipped and counted.

``stats()`` reports frames decoded vs analysed (``video.frames.FrameStats``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..video.frames import FrameStats
from .landmarks import LandmarkFrame

THUMB = 32  # thumbnail side (pixels) for frame differencing


@dataclass(frozen=True)
class SamplingPolicy:
    min_fps: float = 2.0
    max_fps: float = 15.0
    budget_fps: float = 10.0  # the stream's average budget
    burst: float = 8.0  # frames the budget lets through at once
    still: float = 0.005  # pixel motion (mean |diff| / 255) below which the picture counts as still
    moving: float = 0.03  # ... above which it counts as fully moving
    hand_still: float = 0.5  # hand speed (palm lengths / s) ...
    hand_moving: float = 4.0
    hold_s: float = 0.5  # a hand's speed is kept this long after it was last seen


def thumbnail(rgb: np.ndarray) -> np.ndarray:
    """A THUMB x THUMB-ish grey thumbnail by striding (no resampling library, microseconds)."""
    h, w = rgb.shape[:2]
    sy, sx = max(1, h // THUMB), max(1, w // THUMB)
    small = rgb[::sy, ::sx].astype(np.float32)
    return (small[..., 0] * 0.299 + small[..., 1] * 0.587 + small[..., 2] * 0.114) / 255.0


class AdaptiveSampler:
    def __init__(self, policy: SamplingPolicy | None = None) -> None:
        self.policy = policy or SamplingPolicy()
        self.decoded = 0
        self.analysed = 0
        self.over_budget = 0  # frames the rate wanted but the budget refused
        self._thumb: np.ndarray | None = None
        self._pixel_motion = 1.0  # the first frame is analysed
        self._hand_motion = 0.0
        self._last_analysed: float | None = None
        self._tokens = self.policy.burst
        self._clock: float | None = None
        self._hands: tuple[float, np.ndarray] | None = None

    def offer(self, t: float, rgb: np.ndarray) -> bool:
        """A decoded frame at media time ``t``: True if it should be analysed now (counted as analysed)."""
        p = self.policy
        self.decoded += 1
        thumb = thumbnail(rgb)
        if self._thumb is not None and thumb.shape == self._thumb.shape:
            self._pixel_motion = float(np.abs(thumb - self._thumb).mean())
        self._thumb = thumb
        if self._clock is not None:
            self._tokens = min(p.burst, self._tokens + max(0.0, t - self._clock) * p.budget_fps)
        self._clock = t
        if self._last_analysed is not None and t - self._last_analysed < 1.0 / self.rate() - 1e-9:
            return False
        if self._tokens < 1.0:
            self.over_budget += 1
            return False
        self._tokens -= 1.0
        self._last_analysed = t
        self.analysed += 1
        return True

    def observe(self, frame: LandmarkFrame) -> None:
        """The extractor's result for an analysed frame: the hands' speed feeds the rate."""
        present = [h for h in (0, 1) if frame.hand_present[h]]
        if not present:
            # a hand missed in one frame (motion blur, the detector) is often still moving: keep its speed for
            # ``hold_s``, then count the picture as still
            if self._hands is None or frame.t - self._hands[0] > self.policy.hold_s:
                self._hand_motion = 0.0
                self._hands = None
            return
        wrists = frame.hands[:, 0].astype(np.float64)
        palm = float(np.median([np.linalg.norm(frame.hands[h, 9] - frame.hands[h, 0]) for h in present]))
        now = wrists[present]
        if self._hands is not None and frame.t > self._hands[0]:
            prev_t, prev = self._hands
            # each wrist against the nearest wrist of the previous analysis (the left / right labels of one hand
            # can swap between frames)
            moved = max(float(np.linalg.norm(prev - w, axis=1).min()) for w in now)
            self._hand_motion = moved / max(palm, 1e-4) / (frame.t - prev_t)
        self._hands = (frame.t, now)

    def motion(self) -> float:
        """0 (still) .. 1 (moving): the larger of the two signals, each between its thresholds."""
        p = self.policy
        pixel = (self._pixel_motion - p.still) / (p.moving - p.still)
        hand = (self._hand_motion - p.hand_still) / (p.hand_moving - p.hand_still)
        return float(np.clip(max(pixel, hand), 0.0, 1.0))

    def rate(self) -> float:
        p = self.policy
        return p.min_fps + (p.max_fps - p.min_fps) * self.motion()

    def stats(self) -> FrameStats:
        return FrameStats(decoded=self.decoded, analysed=self.analysed)
