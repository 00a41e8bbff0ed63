"""Quality metrics: BLEU and chrF (sacrebleu, signatures reported), WER and CER (jiwer)."""

from __future__ import annotations

import jiwer
from sacrebleu.metrics import BLEU, CHRF

from .results import Score

_NORM = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(), jiwer.Strip()])


def bleu(hyps: list[str], refs: list[str]) -> Score:
    m = BLEU()
    s = m.corpus_score(hyps, [refs])
    return {"score": round(s.score, 2), "signature": str(m.get_signature())}


def chrf(hyps: list[str], refs: list[str]) -> Score:
    m = CHRF()
    s = m.corpus_score(hyps, [refs])
    return {"score": round(s.score, 2), "signature": str(m.get_signature())}


def wer(hyps: list[str], refs: list[str]) -> float:
    """Corpus WER after lower-casing and removing punctuation (numbers are not normalised)."""
    return round(float(jiwer.wer([_NORM(r) for r in refs], [_NORM(h) or "<empty>" for h in hyps])), 4)


def cer(hyps: list[str], refs: list[str]) -> float:
    return round(float(jiwer.cer([_NORM(r) for r in refs], [_NORM(h) or "<empty>" for h in hyps])), 4)


def joint_score(bleu_score: float, wer_value: float, a: float = 0.6) -> float:
    """The degradation study's single number: BLEU - a * WER * 100."""
    return round(bleu_score - a * wer_value * 100, 2)
