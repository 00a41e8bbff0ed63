"""Landmarks: what an extractor reads from a video frame (hands, pose, the lip region of the face mesh), and the
Protocol any extractor implements, so that a trained model can replace mediapipe.

Coordinates are isotropic image units: pixels divided by the frame's longer side (x right, y down), so a circle
stays a circle whatever the aspect ratio. Every part has a presence flag: an absent hand is zeros with
``present=False``, never a guess.

The JSON form (upload and export) is one object per frame::

    {"t": 0.04, "left_hand": [[x, y] * 21] | null, "right_hand": [[x, y] * 21] | null,
     "pose": [[x, y] * 33] | null, "lips": [[x, y] * 40] | null}

"left" and "right" are the signer's own hands as the extractor labels them (mediapipe's handedness, corrected for
its mirror-image convention in the worker).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

import numpy as np

from ..errors import InvalidParameter

HAND_POINTS = 21
POSE_POINTS = 33
# the lip contour of mediapipe's 468-point face mesh (FACEMESH_LIPS: outer and inner lips, 40 points), in a fixed order
LIP_INDICES: tuple[int, ...] = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 185, 40, 39, 37, 0, 267, 269,
                                270, 409, 78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 191, 80, 81, 82, 13,
                                312, 311, 310, 415)
LIP_POINTS = len(LIP_INDICES)
LIP_CORNERS = (0, 10)  # positions of mesh points 61 and 291 (the mouth's corners) in LIP_INDICES
POSE_SHOULDERS = (11, 12)  # mediapipe pose: left and right shoulder
LEFT, RIGHT = 0, 1
MAX_FRAMES = 2_000  # one example or one recognised window: about a minute at 30 fps
PARTS = {"left_hand": HAND_POINTS, "right_hand": HAND_POINTS, "pose": POSE_POINTS, "lips": LIP_POINTS}


class FrameJSON(TypedDict):
    """One frame's JSON form: its time and each part's [x, y] points (None: not in view)."""

    t: float
    left_hand: list[list[float]] | None
    right_hand: list[list[float]] | None
    pose: list[list[float]] | None
    lips: list[list[float]] | None


@dataclass(frozen=True, slots=True)
class LandmarkFrame:
    """One analysed frame. ``hands`` is 2 x 21 x 2 (signer's left, right), ``pose`` 33 x 2, ``lips`` 40 x 2."""

    t: float
    hands: np.ndarray
    hand_present: tuple[bool, bool]
    pose: np.ndarray
    pose_present: bool
    lips: np.ndarray
    lips_present: bool

    @staticmethod
    def empty(t: float) -> LandmarkFrame:
        return LandmarkFrame(t, np.zeros((2, HAND_POINTS, 2), np.float32), (False, False),
                             np.zeros((POSE_POINTS, 2), np.float32), False,
                             np.zeros((LIP_POINTS, 2), np.float32), False)

    @property
    def any_hand(self) -> bool:
        return self.hand_present[0] or self.hand_present[1]


@dataclass(frozen=True, slots=True)
class LandmarkSeq:
    """A time-ordered run of frames as arrays: t (T,), hands (T, 2, 21, 2), hand_mask (T, 2), pose (T, 33, 2),
    pose_mask (T,), lips (T, 40, 2), lips_mask (T,)."""

    t: np.ndarray
    hands: np.ndarray
    hand_mask: np.ndarray
    pose: np.ndarray
    pose_mask: np.ndarray
    lips: np.ndarray
    lips_mask: np.ndarray

    def __len__(self) -> int:
        return int(self.t.shape[0])

    @property
    def duration(self) -> float:
        return float(self.t[-1] - self.t[0]) if len(self) else 0.0

    @staticmethod
    def from_frames(frames: Sequence[LandmarkFrame]) -> LandmarkSeq:
        if not frames:
            raise InvalidParameter("a landmark sequence needs at least one frame")
        return LandmarkSeq(
            t=np.array([f.t for f in frames], np.float64),
            hands=np.stack([f.hands for f in frames]).astype(np.float32),
            hand_mask=np.array([f.hand_present for f in frames], bool),
            pose=np.stack([f.pose for f in frames]).astype(np.float32),
            pose_mask=np.array([f.pose_present for f in frames], bool),
            lips=np.stack([f.lips for f in frames]).astype(np.float32),
            lips_mask=np.array([f.lips_present for f in frames], bool))

    def frames(self) -> list[LandmarkFrame]:
        return [LandmarkFrame(float(self.t[i]), self.hands[i], (bool(self.hand_mask[i, 0]), bool(self.hand_mask[i, 1])),
                              self.pose[i], bool(self.pose_mask[i]), self.lips[i], bool(self.lips_mask[i]))
                for i in range(len(self))]

    def window(self, start: float, end: float) -> LandmarkSeq | None:
        """The frames with start <= t <= end, or None if there are none."""
        keep = (self.t >= start) & (self.t <= end)
        if not keep.any():
            return None
        return LandmarkSeq(self.t[keep], self.hands[keep], self.hand_mask[keep], self.pose[keep],
                           self.pose_mask[keep], self.lips[keep], self.lips_mask[keep])

    # ---- JSON --------------------------------------------------------------------------------------------------
    def to_json(self) -> list[FrameJSON]:
        return list(self.iter_json())

    def iter_json(self) -> Iterator[FrameJSON]:
        """The JSON form one frame at a time (a writer that encodes each frame as it comes keeps only one frame's
        lists alive, not a sequence's hundreds of thousands, which the cyclic GC would walk)."""
        for i in range(len(self)):
            yield {"t": round(float(self.t[i]), 4),
                   "left_hand": _points(self.hands[i, LEFT]) if self.hand_mask[i, LEFT] else None,
                   "right_hand": _points(self.hands[i, RIGHT]) if self.hand_mask[i, RIGHT] else None,
                   "pose": _points(self.pose[i]) if self.pose_mask[i] else None,
                   "lips": _points(self.lips[i]) if self.lips_mask[i] else None}

    @staticmethod
    def from_json(frames: object, *, max_frames: int = MAX_FRAMES) -> LandmarkSeq:
        """Parse the JSON form, checking every shape and number: a bad one is an ``invalid_parameter`` naming the
        frame and the part."""
        if not isinstance(frames, list) or not frames:
            raise InvalidParameter("'frames' must be a non-empty list of {t, left_hand, right_hand, pose, lips}",
                                   details={"field": "frames"})
        if len(frames) > max_frames:
            raise InvalidParameter(f"at most {max_frames} frames in one sequence (got {len(frames)})",
                                   details={"field": "frames", "limit": max_frames})
        out: list[LandmarkFrame] = []
        last = -math.inf
        for i, raw in enumerate(frames):
            if not isinstance(raw, dict):
                raise InvalidParameter(f"frame {i} is not an object", details={"field": f"frames[{i}]"})
            t = raw.get("t", i / 30.0)
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < last:
                raise InvalidParameter(f"frame {i}: 't' must be a finite number, not before the previous frame's",
                                       details={"field": f"frames[{i}].t"})
            last = float(t)
            parts = {name: _parse_part(raw.get(name), n, f"frames[{i}].{name}") for name, n in PARTS.items()}
            unknown = set(raw) - set(PARTS) - {"t"}
            if unknown:
                raise InvalidParameter(f"frame {i}: unknown field(s) {sorted(unknown)}",
                                       details={"field": f"frames[{i}]"})
            left, right = parts["left_hand"], parts["right_hand"]
            hands = np.stack([left if left is not None else np.zeros((HAND_POINTS, 2), np.float32),
                              right if right is not None else np.zeros((HAND_POINTS, 2), np.float32)])
            pose, lips = parts["pose"], parts["lips"]
            out.append(LandmarkFrame(float(t), hands, (left is not None, right is not None),
                                     pose if pose is not None else np.zeros((POSE_POINTS, 2), np.float32),
                                     pose is not None,
                                     lips if lips is not None else np.zeros((LIP_POINTS, 2), np.float32),
                                     lips is not None))
        return LandmarkSeq.from_frames(out)


def _points(a: np.ndarray) -> list[list[float]]:
    return [[round(float(x), 5), round(float(y), 5)] for x, y in a]


def _parse_part(value: object, n: int, field: str) -> np.ndarray | None:
    if value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameter(f"{field}: expected {n} [x, y] pairs of numbers", details={"field": field}) from exc
    if arr.shape != (n, 2):
        raise InvalidParameter(f"{field}: expected {n} [x, y] pairs, got shape {list(arr.shape)}",
                               details={"field": field})
    if not np.isfinite(arr).all() or np.abs(arr).max() > 100:
        raise InvalidParameter(f"{field}: coordinates must be finite image units (about 0..1)",
                               details={"field": field})
    return arr.astype(np.float32)


class LandmarkExtractor(Protocol):
    """Reads landmarks from RGB frames. Implementations: ``extractor.MediapipeExtractor`` (mediapipe 0.10.21 in a
    worker process). A trained sign or lip model would implement this Protocol (or replace the recogniser that
    reads its output: ``recogniser.Recogniser``)."""

    name: str

    def extract(self, frames: Sequence[tuple[float, np.ndarray]], *, parts: frozenset[str],
                session: str | None = None) -> list[LandmarkFrame]:
        """Landmarks for each (t, H x W x 3 uint8 RGB) frame, in order; ``parts`` is a subset of
        {"hands", "pose", "lips"} (fewer parts cost less); ``session`` names the video the frames come from (an
        extractor that tracks keeps its state per session). Raises a ``BackendError`` if the extractor failed."""
        ...

    def close(self) -> None: ...
