"""From a landmark sequence to the feature sequence the recogniser compares (pure numpy).

Signs: the dominant hand (the one present in more frames; on a tie the one that travels further) is put in the
right-hand slot; if it is the signer's left hand, every x is mirrored first, so a left-handed signer matches a
right-handed example. Per frame and hand: the 20 finger points relative to the wrist, divided by that frame's palm
length (wrist to the middle finger's knuckle), rotated so the palm points up (handshape, invariant to position,
size and in-plane roll); the wrist's position relative to the dominant wrist's mean over the sequence, divided by
the median palm length (the movement, invariant to where the signer stands and how far from the camera); a presence
flag. The hands' positions relative to the body (near the face or the chest) are not used: the pose is often
missing, and a feature that exists in some examples and not in others would make them incomparable.

Lips: per frame, after levelling the line between the mouth's corners (head roll), the opening between each
lower-lip point and the upper-lip point above it (9 outer, 9 inner) and the mouth's width, all divided by the
median mouth width over the sequence (so opening and widening still count, distance from the camera does not),
smoothed over 3 frames (the face mesh jitters).

Both are resampled to ``length`` frames evenly spaced in time; dynamic time warping then absorbs the rest of the
speed changes.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import InvalidParameter
from .landmarks import LEFT, LIP_CORNERS, RIGHT, LandmarkSeq

Kind = Literal["sign", "lip"]
KINDS: tuple[str, ...] = ("sign", "lip")
LENGTH = 32
SHAPE_WEIGHT = 0.5  # handshape features are many (40 per hand); movement gets the larger weight per value
MOVE_WEIGHT = 2.0
PRESENCE_WEIGHT = 1.0
MIDDLE_MCP = 9
ONE_HAND_TOGETHER = 0.5  # both labels in fewer than this share of the frames with a hand: one hand, relabelled
# lip heights: each lower-lip point of LIP_INDICES paired with the upper-lip point above it (outer, then inner)
LIP_LOWER = (1, 2, 3, 4, 5, 6, 7, 8, 9, 21, 22, 23, 24, 25, 26, 27, 28, 29)
LIP_UPPER = (11, 12, 13, 14, 15, 16, 17, 18, 19, 31, 32, 33, 34, 35, 36, 37, 38, 39)
LIP_WEIGHT = 4.0


def features(seq: LandmarkSeq, kind: str, length: int = LENGTH) -> np.ndarray:
    """(length, F) float32 features of ``seq`` for ``kind`` ("sign" or "lip")."""
    if kind == "sign":
        return sign_features(seq, length)
    if kind == "lip":
        return lip_features(seq, length)
    raise InvalidParameter(f"kind must be one of {list(KINDS)}, not {kind!r}", details={"field": "kind"})


def dominant_hand(seq: LandmarkSeq) -> int:
    counts = seq.hand_mask.sum(axis=0)
    if counts[LEFT] != counts[RIGHT]:
        return LEFT if counts[LEFT] > counts[RIGHT] else RIGHT
    travel = [_path_length(seq.hands[seq.hand_mask[:, h], h, 0]) for h in (LEFT, RIGHT)]
    return LEFT if travel[LEFT] > travel[RIGHT] else RIGHT


def sign_features(seq: LandmarkSeq, length: int = LENGTH) -> np.ndarray:
    present = seq.hand_mask.any(axis=1)
    if present.sum() < 2:
        raise InvalidParameter("a sign needs at least 2 frames with a hand in them", details={"field": "frames"})
    first, last = np.flatnonzero(present)[[0, -1]]
    t = seq.t[first:last + 1]
    hands = seq.hands[first:last + 1].astype(np.float64)
    mask = seq.hand_mask[first:last + 1]
    hands, mask = _one_hand(hands, mask)
    if dominant_hand(LandmarkSeq(t, hands.astype(np.float32), mask, seq.pose[first:last + 1],
                                 seq.pose_mask[first:last + 1], seq.lips[first:last + 1],
                                 seq.lips_mask[first:last + 1])) == LEFT:
        # mirror: the signer's left hand becomes a right hand doing the same thing
        hands = hands[:, ::-1].copy()
        hands[..., 0] *= -1.0
        mask = mask[:, ::-1]
    dom = mask[:, RIGHT]
    palm = np.linalg.norm(hands[:, :, MIDDLE_MCP] - hands[:, :, 0], axis=-1)  # (T, 2)
    scale = float(np.median(palm[mask])) if mask.any() else 1.0
    scale = max(scale, 1e-4)
    origin = hands[dom, RIGHT, 0].mean(axis=0) if dom.any() else hands[mask][:, 0].mean(axis=0)
    per_hand = []
    for h in (RIGHT, LEFT):  # dominant slot first
        m = mask[:, h]
        shape = _hand_shape(hands[:, h], palm[:, h]) * SHAPE_WEIGHT
        move = (hands[:, h, 0] - origin) / scale * MOVE_WEIGHT
        flag = m[:, None].astype(np.float64) * PRESENCE_WEIGHT
        block = np.concatenate([shape, move, flag], axis=1)
        block[~m, :-1] = 0.0
        per_hand.append(block)
    return resample(t, np.concatenate(per_hand, axis=1), length)


def _one_hand(hands: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A one-handed sign as mediapipe reports it: the hand labelled left in some frames and right in others (its
    handedness flips on a hand seen edge-on or blurred), sometimes found twice in one frame, sometimes beside a
    spurious second "hand". When the two labels are seen together in fewer than half the frames with a hand, it is
    one hand: each frame's (the one nearest the previous frame's wrist when there are two) goes into the slot of
    the majority label. A two-handed sign (both hands in most frames) is left as it is."""
    any_hand = mask.any(axis=1)
    both = mask[:, LEFT] & mask[:, RIGHT]
    if both.sum() >= ONE_HAND_TOGETHER * any_hand.sum() or not both.any() and mask.all(axis=0).any():
        return hands, mask
    counts = mask.sum(axis=0)
    slot = LEFT if counts[LEFT] > counts[RIGHT] else RIGHT
    merged = np.zeros_like(hands)
    prev: np.ndarray | None = None
    for i in np.flatnonzero(any_hand):
        if both[i]:
            pick = slot if prev is None else min((LEFT, RIGHT), key=lambda h: float(
                np.linalg.norm(hands[i, h, 0] - prev)))
        else:
            pick = LEFT if mask[i, LEFT] else RIGHT
        merged[i, slot] = hands[i, pick]
        prev = hands[i, pick, 0]
    new_mask = np.zeros_like(mask)
    new_mask[:, slot] = any_hand
    return merged, new_mask


def _hand_shape(hand: np.ndarray, palm: np.ndarray) -> np.ndarray:
    """(T, 40): fingers relative to the wrist, palm length 1, rotated so the wrist->middle knuckle line points up."""
    rel = hand[:, 1:] - hand[:, :1]
    axis = hand[:, MIDDLE_MCP] - hand[:, 0]
    angle = np.arctan2(axis[:, 0], -axis[:, 1])  # 0 when the palm points up (y down in image units)
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    x, y = rel[..., 0], rel[..., 1]
    rot = np.stack([c * x + s * y, -s * x + c * y], axis=-1)
    rot /= np.maximum(palm, 1e-4)[:, None, None]
    return rot.reshape(len(hand), -1)


def lip_features(seq: LandmarkSeq, length: int = LENGTH) -> np.ndarray:
    m = seq.lips_mask
    if m.sum() < 2:
        raise InvalidParameter("a lip example needs at least 2 frames with the lips in them",
                               details={"field": "frames"})
    t, lips = seq.t[m], seq.lips[m].astype(np.float64)
    corner = lips[:, LIP_CORNERS[1]] - lips[:, LIP_CORNERS[0]]
    width = np.linalg.norm(corner, axis=-1)
    angle = np.arctan2(corner[:, 1], corner[:, 0])
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    y = -s * lips[..., 0] + c * lips[..., 1]  # vertical after levelling the corners
    scale = max(float(np.median(width)), 1e-4)
    heights = (y[:, LIP_LOWER] - y[:, LIP_UPPER]) / scale
    feats = np.concatenate([heights, (width / scale)[:, None]], axis=1) * LIP_WEIGHT
    return resample(t, _smooth(feats), length)


def _smooth(values: np.ndarray) -> np.ndarray:
    """A 3-frame moving average (detector jitter), the ends kept."""
    if len(values) < 3:
        return values
    out = values.copy()
    out[1:-1] = (values[:-2] + values[1:-1] + values[2:]) / 3.0
    return out


def resample(t: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """``values`` (T, F) at times ``t`` -> (length, F) at evenly spaced times (linear interpolation)."""
    t = np.asarray(t, np.float64)
    if t[-1] <= t[0]:
        t = np.arange(len(t), dtype=np.float64)
    grid = np.linspace(t[0], t[-1], length)
    out = np.empty((length, values.shape[1]), np.float64)
    for j in range(values.shape[1]):
        out[:, j] = np.interp(grid, t, values[:, j])
    return out.astype(np.float32)


def _path_length(points: np.ndarray) -> float:
    return float(np.linalg.norm(np.diff(points, axis=0), axis=1).sum()) if len(points) > 1 else 0.0
