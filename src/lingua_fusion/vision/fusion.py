"""Fusion of speech with lip and sign evidence (pure): which text a caption carries and which modalities made it.

Inputs for one utterance: ASR hypotheses (best first, each with word timings and probabilities; none when the
audio dropped out) and visual evidence (lip keywords and signs recognised over time spans of the same timeline).

- Speech and lips: for each hypothesis, every word in the lip vocabulary is checked against the lip evidence that
  overlaps it in time. Evidence naming the same word confirms it (+``confirm_bonus`` x the evidence's confidence);
  confident evidence naming another vocabulary word contradicts it (-``contradict_penalty`` x confidence). The
  hypothesis with the best ASR score plus these adjustments wins (re-ranking). In the winner, a vocabulary word
  that lip evidence contradicts with confidence >= ``replace_confidence`` while ASR was unsure of it
  (probability < ``weak_word``) is replaced by the lips' word.
- Confidence gating: ASR below ``min_asr_confidence`` is dropped when there is visual evidence; the caption is then
  made of that evidence (signs' glosses, or lip keywords) and says so.
- Nothing but visual evidence (the audio dropped out): the caption is the evidence, signs first (a signed
  utterance), else lip keywords. Nothing at all: no caption. Signs seen while confident speech goes on are not
  merged into the spoken caption: they are captions of their own (``service.GlossSpan``).

Every caption lists its modalities (``audio``, ``lips``, ``sign``): lips count when they confirmed, re-ranked or
replaced something, not merely when a face was in view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Word:
    text: str
    start: float
    end: float
    probability: float = 1.0


@dataclass(frozen=True)
class AsrHypothesis:
    words: tuple[Word, ...]
    confidence: float  # the hypothesis's own score, 0..1 (e.g. exp(mean log-probability))

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)


@dataclass(frozen=True)
class Evidence:
    gloss: str
    start: float
    end: float
    confidence: float
    modality: str  # "lips" or "sign"


@dataclass(frozen=True)
class FusionPolicy:
    min_asr_confidence: float = 0.4  # the stream's speech gate: below it ASR gives way to visual evidence
    confirm_bonus: float = 0.15
    contradict_penalty: float = 0.25
    replace_confidence: float = 0.5
    weak_word: float = 0.6
    min_overlap: float = 0.3  # share of the shorter span two spans must share to be about the same word


@dataclass(frozen=True)
class FusedCaption:
    text: str
    start: float
    end: float
    confidence: float
    modalities: tuple[str, ...]
    replaced: tuple[tuple[str, str], ...] = ()  # (ASR word, lip word)


def norm_word(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum() or ch in "'-")


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    inter = min(a1, b1) - max(a0, b0)
    shorter = max(min(a1 - a0, b1 - b0), 1e-6)
    return max(0.0, inter) / shorter


def _lip_for(word: Word, lips: Sequence[Evidence], policy: FusionPolicy) -> Evidence | None:
    best = None
    for e in lips:
        if _overlap(word.start, word.end, e.start, e.end) >= policy.min_overlap and (
                best is None or e.confidence > best.confidence):
            best = e
    return best


def _score(hyp: AsrHypothesis, lips: Sequence[Evidence], vocab: set[str], policy: FusionPolicy
           ) -> tuple[float, bool]:
    score, used = hyp.confidence, False
    for w in hyp.words:
        if norm_word(w.text) not in vocab:
            continue
        e = _lip_for(w, lips, policy)
        if e is None:
            continue
        if norm_word(e.gloss) == norm_word(w.text):
            score += policy.confirm_bonus * e.confidence
            used = True
        elif norm_word(e.gloss) in vocab:
            score -= policy.contradict_penalty * e.confidence
            used = True
    return score, used


def fuse(hypotheses: Sequence[AsrHypothesis], evidence: Sequence[Evidence], lip_vocabulary: set[str],
         policy: FusionPolicy | None = None) -> FusedCaption | None:
    p = policy or FusionPolicy()
    vocab = {norm_word(w) for w in lip_vocabulary}
    lips = [e for e in evidence if e.modality == "lips"]
    signs = [e for e in evidence if e.modality == "sign"]
    speech = [h for h in hypotheses if h.words]
    if speech and speech[0].confidence < p.min_asr_confidence and evidence:
        speech = []  # confidence gating: unsure speech gives way to what was seen
    if not speech:
        return _visual_only(signs or lips)
    scored = [(_score(h, lips, vocab, p), i, h) for i, h in enumerate(speech)]
    (score, used), rank, best = max(scored, key=lambda x: (x[0][0], -x[1]))
    words, replaced = [], []
    for w in best.words:
        e = _lip_for(w, lips, p) if norm_word(w.text) in vocab else None
        if (e is not None and norm_word(e.gloss) in vocab and norm_word(e.gloss) != norm_word(w.text)
                and e.confidence >= p.replace_confidence and w.probability < p.weak_word):
            words.append(e.gloss)
            replaced.append((w.text, e.gloss))
            used = True
        else:
            words.append(w.text)
    modalities = ("audio", "lips") if used or rank != 0 else ("audio",)
    return FusedCaption(" ".join(words), best.words[0].start, best.words[-1].end,
                        round(min(1.0, max(0.0, score)), 4), modalities, tuple(replaced))


def _visual_only(evidence: Sequence[Evidence]) -> FusedCaption | None:
    if not evidence:
        return None
    ordered = sorted(evidence, key=lambda e: e.start)
    conf = min(e.confidence for e in ordered)
    return FusedCaption(" ".join(e.gloss for e in ordered), ordered[0].start, ordered[-1].end, round(conf, 4),
                        tuple(sorted({e.modality for e in ordered})))
