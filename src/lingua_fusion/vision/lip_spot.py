"""Lip keywords in a stream of lip landmarks (pure): where the mouth moved, which taught word each movement was, and
the ASR words placed on the same timeline so that ``fusion.fuse`` can weigh one against the other.

- Activity: a frame's mouth opening is the mean height between the inner lips over the mouth's width (distance from
  the camera cancels). The mouth at rest is the stream's own low level (``rest_quantile`` of the openings seen); a
  frame is active when its opening is ``active_above`` over it. Active runs closer than ``gap_s`` are one movement;
  runs shorter than ``min_s`` are dropped (a twitch); each run is widened to the frames around it still a third as
  open (where the word starts and ends).
- Spotting: each movement, with a few margins of rest around it (the taught examples are rest, word, rest), is
  recognised against the lip vocabulary (``recogniser.Recogniser``); the nearest answer, if known and confident, is
  an ``Evidence`` with the recogniser's confidence.
- ASR words on the timeline: the ASR port returns an utterance's text and one confidence, not word times. Each
  word's time is estimated from its share of the utterance's characters, and each vocabulary word of the text is
  then matched with the nearest lip word spotted in the utterance (in order, each lip word used once): its span
  becomes that lip word's, so confirmation and contradiction do not depend on the estimate's accuracy. Every
  word's probability is the utterance's confidence (the only one there is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .fusion import AsrHypothesis, Evidence, Word, norm_word
from .landmarks import LIP_CORNERS, LandmarkFrame, LandmarkSeq
from .normalise import LIP_LOWER, LIP_UPPER
from .recogniser import Recogniser
from .segment import Span

INNER = 9  # LIP_LOWER / LIP_UPPER: the first 9 pairs are the outer lips, the next 9 the inner


@dataclass(frozen=True)
class SpotPolicy:
    rest_quantile: float = 0.25
    active_above: float = 0.04  # opening (inner height / width) over the resting level that counts as moving
    gap_s: float = 0.35
    min_s: float = 0.2
    margin_s: float = 0.4  # lips this far around an utterance are looked at
    margins_s: tuple[float, ...] = (0.05, 0.2, 0.35)  # rest around a movement tried when it is recognised
    max_s: float = 3.0  # a longer movement is cut: one word is not that long
    min_confidence: float = 0.2  # lip words less sure than this are not evidence


def opening(frame: LandmarkFrame) -> float:
    """The mouth's opening in a frame with lips: mean inner-lip height / mouth width (0 without lips)."""
    if not frame.lips_present:
        return 0.0
    lips = frame.lips.astype(np.float64)
    width = float(np.linalg.norm(lips[LIP_CORNERS[1]] - lips[LIP_CORNERS[0]]))
    lower = lips[list(LIP_LOWER[INNER:]), 1]
    upper = lips[list(LIP_UPPER[INNER:]), 1]
    return float(np.abs(lower - upper).mean() / max(width, 1e-4))


def rest_level(openings: Sequence[float], policy: SpotPolicy) -> float:
    return float(np.quantile(np.asarray(openings), policy.rest_quantile)) if len(openings) else 0.0


def smooth(openings: Sequence[float]) -> np.ndarray:
    """Openings averaged with their neighbours' (the face mesh jitters)."""
    raw = np.asarray(openings, np.float64)
    if len(raw) < 3:
        return raw
    out = raw.copy()
    out[1:-1] = (raw[:-2] + raw[1:-1] + raw[2:]) / 3.0
    return out


def active_spans(frames: Sequence[LandmarkFrame], rest: float, policy: SpotPolicy,
                 openings: Sequence[float] | None = None) -> list[Span]:
    """Movements of the mouth: runs of frames opened ``active_above`` over ``rest`` (joined across gaps shorter
    than ``gap_s``), each widened to the frames around it still a third of that open (the word's start and end).
    ``openings``: the frames' openings when already known (all frames then have lips)."""
    if openings is None:
        frames = [f for f in frames if f.lips_present]
        openings = [opening(f) for f in frames]
    if not frames:
        return []
    t = np.array([f.t for f in frames])
    o = smooth(openings)
    high, low = rest + policy.active_above, rest + policy.active_above / 3
    runs: list[list[int]] = []
    for i in np.flatnonzero(o >= high).tolist():
        if runs and t[i] - t[runs[-1][1]] <= policy.gap_s and t[i] - t[runs[-1][0]] <= policy.max_s:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    spans: list[Span] = []
    for a, b in runs:
        while a > 0 and o[a - 1] >= low:
            a -= 1
        while b < len(o) - 1 and o[b + 1] >= low:
            b += 1
        if spans and t[a] <= spans[-1].end:
            spans[-1] = Span(spans[-1].start, float(t[b]))
        else:
            spans.append(Span(float(t[a]), float(t[b])))
    return [s for s in spans if s.end - s.start >= policy.min_s]


def spot(frames: Sequence[LandmarkFrame], spans: Sequence[Span], recogniser: Recogniser, policy: SpotPolicy
         ) -> list[Evidence]:
    """Each span recognised against the lip vocabulary, with a few margins of rest around it (taught examples
    are rest, word, rest; the span's edges are uncertain): the nearest answer, if known and confident."""
    with_lips = [f for f in frames if f.lips_present]
    if len(with_lips) < 2:
        return []
    seq = LandmarkSeq.from_frames(with_lips)
    out = []
    for s in spans:
        best = None
        for margin in policy.margins_s:
            window = seq.window(s.start - margin, s.end + margin)
            if window is None or len(window) < 3:
                continue
            r = recogniser.recognise(window)
            if best is None or r.distance < best.distance:
                best = r
        if best is not None and best.known and best.confidence >= policy.min_confidence:
            out.append(Evidence(best.gloss, s.start, s.end, best.confidence, "lips"))
    return out


def hypothesis(text: str, confidence: float, start: float, end: float, lips: Sequence[Evidence],
               vocabulary: set[str]) -> AsrHypothesis:
    """The utterance's words on the timeline (see the module docstring), each with the utterance's confidence."""
    tokens = text.split()
    if not tokens:
        return AsrHypothesis((), confidence)
    weights = np.array([len(t) + 1 for t in tokens], np.float64)
    edges = start + (end - start) * np.concatenate([[0.0], np.cumsum(weights) / weights.sum()])
    words = [Word(t, float(edges[i]), float(edges[i + 1]), confidence) for i, t in enumerate(tokens)]
    vocab = {norm_word(v) for v in vocabulary}
    unused = sorted(lips, key=lambda e: e.start)
    for i, w in enumerate(words):
        if norm_word(w.text) not in vocab or not unused:
            continue
        centre = (w.start + w.end) / 2
        e = min(unused, key=lambda ev: abs((ev.start + ev.end) / 2 - centre))
        unused.remove(e)
        words[i] = Word(w.text, e.start, e.end, confidence)
    return AsrHypothesis(tuple(words), confidence)
