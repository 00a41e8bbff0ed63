"""Diarization error rate and speaker agreement, our own implementation (pure, numpy only).

Both compare a reference (who spoke when: ``Span``s) with a hypothesis (the labelled segments), on a 10 ms grid:

- **DER** = (missed speech + false alarm + speaker confusion) / reference speech time, the NIST definition, with
  the hypothesis labels mapped one-to-one onto the reference speakers by the mapping that makes the confusion
  least (searched exhaustively: a few speakers each side). At each frame, with R reference and H hypothesis
  speakers active: missed max(0, R - H), false alarm max(0, H - R), confusion min(R, H) minus the mapped
  speakers that match. Overlapped speech counts each speaker. ``collar`` seconds either side of every reference
  boundary are not scored (NIST's usual 0.25 s forgives where a turn's first and last syllables fall).
- **Agreement** (time-weighted speaker agreement) = the share of the reference speech that the hypothesis
  covers where the mapped hypothesis speaker is a reference speaker of that frame: it leaves out what the
  speech segmentation (ASR's segment times) missed or added, and measures only whether the speakers are right.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

STEP = 0.01


@dataclass(frozen=True)
class Span:
    speaker: str
    start: float
    end: float


@dataclass(frozen=True)
class Score:
    der: float
    missed: float  # seconds
    false_alarm: float
    confusion: float
    speech: float  # scored reference speech, seconds
    agreement: float
    mapping: dict[str, str]  # hypothesis label -> reference speaker
    speakers_found: int

    def to_json(self) -> dict[str, object]:
        return {"der": round(self.der, 4), "missed_s": round(self.missed, 3),
                "false_alarm_s": round(self.false_alarm, 3), "confusion_s": round(self.confusion, 3),
                "speech_s": round(self.speech, 3), "agreement": round(self.agreement, 4),
                "mapping": self.mapping, "speakers_found": self.speakers_found}


def _grid(spans: list[Span], names: list[str], frames: int) -> np.ndarray:
    g = np.zeros((len(names), frames), bool)
    for s in spans:
        g[names.index(s.speaker), int(round(s.start / STEP)):int(round(s.end / STEP))] = True
    return g


def score(reference: list[Span], hypothesis: list[Span], collar: float = 0.0) -> Score:
    ref_names = sorted({s.speaker for s in reference})
    hyp_names = sorted({s.speaker for s in hypothesis})
    end = max([s.end for s in reference + hypothesis] or [0.0])
    frames = int(round(end / STEP)) + 1
    ref, hyp = _grid(reference, ref_names, frames), _grid(hypothesis, hyp_names, frames)
    scored = np.ones(frames, bool)
    if collar > 0:
        for s in reference:
            for t in (s.start, s.end):
                scored[max(0, int(round((t - collar) / STEP))):int(round((t + collar) / STEP))] = False
    ref, hyp = ref[:, scored], hyp[:, scored]
    co = (hyp[:, None, :] & ref[None, :, :]).sum(axis=2)  # (hyp, ref) frames together
    mapping = _best_mapping(co)
    n_ref, n_hyp = ref.sum(axis=0), hyp.sum(axis=0)
    matched = np.zeros(ref.shape[1], int)
    for h, r in mapping.items():
        matched += hyp[h] & ref[r]
    missed = np.maximum(0, n_ref - n_hyp).sum() * STEP
    false_alarm = np.maximum(0, n_hyp - n_ref).sum() * STEP
    confusion = (np.minimum(n_ref, n_hyp) - matched).sum() * STEP
    speech = n_ref.sum() * STEP
    covered = (n_ref > 0) & (n_hyp > 0)
    agree = ((matched > 0) & covered).sum() / max(1, covered.sum())
    return Score(der=(missed + false_alarm + confusion) / max(speech, STEP), missed=missed,
                 false_alarm=false_alarm, confusion=confusion, speech=speech, agreement=float(agree),
                 mapping={hyp_names[h]: ref_names[r] for h, r in mapping.items()}, speakers_found=len(hyp_names))


def _best_mapping(co: np.ndarray) -> dict[int, int]:
    """The one-to-one hypothesis -> reference mapping with the most frames in agreement (exhaustive)."""
    n_hyp, n_ref = co.shape
    best: dict[int, int] = {}
    best_total = -1
    if n_hyp <= n_ref:
        for refs in itertools.permutations(range(n_ref), n_hyp):
            total = sum(int(co[h, r]) for h, r in enumerate(refs))
            if total > best_total:
                best_total, best = total, dict(enumerate(refs))
    else:
        for hyps in itertools.permutations(range(n_hyp), n_ref):
            total = sum(int(co[h, r]) for r, h in enumerate(hyps))
            if total > best_total:
                best_total, best = total, {h: r for r, h in enumerate(hyps)}
    return best
