"""Isolated signs in a longer landmark sequence (pure): a sign is a run of frames with a hand in view, runs
separated by less than ``gap_s`` without hands joined, runs shorter than ``min_s`` dropped (a hand passing by).
Lip words are not segmented here: their windows come from speech (``fusion``) or the whole clip is one word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .landmarks import LandmarkSeq


@dataclass(frozen=True)
class Span:
    start: float
    end: float


def sign_spans(seq: LandmarkSeq, *, gap_s: float = 0.35, min_s: float = 0.25) -> list[Span]:
    present = seq.hand_mask.any(axis=1)
    spans: list[Span] = []
    span: tuple[float, float] | None = None  # the one being built: (start, end)
    for t, p in zip(seq.t.tolist(), np.asarray(present, bool).tolist(), strict=True):
        if not p:
            continue
        if span is None:
            span = (t, t)
        elif t - span[1] > gap_s:
            spans.append(Span(*span))
            span = (t, t)
        else:
            span = (span[0], t)
    if span is not None:
        spans.append(Span(*span))
    return [s for s in spans if s.end - s.start >= min_s]
