"""Isolated signs in a longer landmark sequence (pure): a sign is a run of frames with a hand in view, runs
separated by less than ``gap_s`` without hands joined, runs shorter than ``min_s`` dropped (a hand passing by).
Lip words are not segmented here: their windows come from speech (``fusion``) or the whole clip is one word.
"""

from __future__ import annotations

from dataclasses import dataclass

from .landmarks import LandmarkSeq


@dataclass(frozen=True)
class Span:
    start: float
    end: float


def sign_spans(seq: LandmarkSeq, *, gap_s: float = 0.35, min_s: float = 0.25) -> list[Span]:
    present = seq.hand_mask.any(axis=1)
    spans: list[Span] = []
    start = end = None
    for t, p in zip(seq.t.tolist(), present.tolist(), strict=True):
        if not p:
            continue
        if start is None:
            start = end = t
        elif t - end > gap_s:
            spans.append(Span(start, end))
            start = end = t
        else:
            end = t
    if start is not None and end is not None:
        spans.append(Span(start, end))
    return [s for s in spans if s.end - s.start >= min_s]
