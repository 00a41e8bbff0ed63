"""A video's slides as ASR context: the audio under each slide is transcribed again with that slide's words as
Whisper's prompt (the words of the *current* slide, as a live stream does), and slide terms are corrected from it.

Why pieces and not one prompt for the whole file: Whisper tiny/base given a prompt tends to stop emitting
timestamps, so a whole talk would come back as one 30 s segment. The audio is cut at the slide changes, each cut
moved to the quietest 100 ms within ``SNAP_S`` of the change so that it falls between words; pieces shorter than
``MIN_PIECE_S`` join the one before, and a silent piece is not transcribed. The prompt is the slide's rows as
sentences: a comma list of words made Whisper drop its punctuation and capitalise the listed words.

Whisper reads a prompt as what was said just before, and that fails three ways: a speaker who reads the slide
aloud is skipped (the words are "already said"), over silence Whisper recites the prompt, and slide wording leaks
into the transcript ("But on Friday the sun" became "Sun on Friday. Sun"). So the prompted transcript only
*corrects* the plain one (``correct_terms``): the file is transcribed as any audio is (no prompt: its segments,
timing and language detection), each slide's piece again with the prompt, the two word sequences are aligned, and
a run of plain words is replaced only where the prompted words are all words of the slide and spelt like the words
they replace (similarity >= ``SPELT_LIKE``: "home charts" -> "Helm charts", "Post-R SQL" -> "PostgreSQL"). Words
are never dropped or added. This about doubles the ASR work of a video with slides.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..models.base import ASRResult, ASRSegment
from ..models.word_times import realigned
from ..types import SR
from .slide_reader import SlideSpan

SNAP_S = 1.0
MIN_PIECE_S = 2.0
SILENT_RMS = 0.003  # a piece quieter than this (float samples) holds no speech
SPELT_LIKE = 0.4  # a replacement must be at least this similar (characters) to the plain words it replaces
PROMPT_CHARS = 400  # Whisper's prompt is at most 224 tokens: about this many characters of slide text


@dataclass(frozen=True)
class Piece:
    start: float
    end: float
    prompt: str | None


def _norm(word: str) -> str:
    return re.sub(r"[^\w]", "", word.lower())


def correct_terms(plain: list[ASRSegment], prompted: str, slide_words: set[str]) -> list[ASRSegment]:
    """The plain segments, with runs of words replaced by the prompted transcript's where those are slide words
    spelt like the ones they replace (pure; the module docstring says why)."""
    from difflib import SequenceMatcher

    words = [(i, w) for i, s in enumerate(plain) for w in s.text.split()]
    better = prompted.split()
    a, b = [_norm(w) for _i, w in words], [_norm(w) for w in better]
    out: list[list[str]] = [[] for _ in plain]
    for op, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        new = [w for w in b[j1:j2] if w]
        if (op == "replace" and new and all(w in slide_words for w in new)
                and SequenceMatcher(None, "".join(a[i1:i2]), "".join(new)).ratio() >= SPELT_LIKE):
            out[words[i1][0]].extend(better[j1:j2])
            continue
        for i, w in words[i1:i2]:
            out[i].append(w)
    return [ASRSegment(s.start, s.end, " ".join(ws), s.confidence, realigned(s.words, " ".join(ws)))
            for s, ws in zip(plain, out, strict=True)]


def prompt_of(slide: SlideSpan) -> str:
    rows = (re.sub(r"^[^\w(]+", "", r.text).rstrip(" .:;,") for r in slide.rows)  # bullets off
    sentences = [row + "." for row in rows if row]
    return " ".join(sentences)[:PROMPT_CHARS]


def _quietest(audio: np.ndarray, t: float, sr: int) -> float:
    hop = sr // 10
    lo, hi = max(0, int((t - SNAP_S) * sr)), min(audio.size, int((t + SNAP_S) * sr))
    if hi - lo < 2 * hop:
        return t
    frames = audio[lo:hi - (hi - lo) % hop].reshape(-1, hop)
    energy = (frames.astype(np.float64) ** 2).mean(axis=1)
    candidates = np.flatnonzero(energy <= energy.min() * 1.5 + 1e-12)
    # among the quietest frames, the one nearest the change
    centre = (t * sr - lo) / hop
    i = int(candidates[np.argmin(np.abs(candidates + 0.5 - centre))])
    return (lo + (i + 0.5) * hop) / sr


def pieces(slides: list[SlideSpan], audio: np.ndarray, sr: int = SR) -> list[Piece]:
    """The audio cut at slide changes (snapped to silence), each piece with the prompt of the slide it shows."""
    duration = audio.size / sr
    marks: list[tuple[float, str | None]] = [(0.0, None)]
    for s in sorted(slides, key=lambda s: s.start):
        if s.start >= duration:
            break
        t = 0.0 if s.start <= MIN_PIECE_S / 2 else _quietest(audio, s.start, sr)
        marks.append((t, prompt_of(s)))
        if s.end < duration - MIN_PIECE_S / 2:
            marks.append((_quietest(audio, s.end, sr), None))  # a blank picture after it
    marks.sort(key=lambda m: m[0])
    raw = [Piece(t, marks[i + 1][0] if i + 1 < len(marks) else duration, prompt)
           for i, (t, prompt) in enumerate(marks)]
    out: list[Piece] = []
    for p in (p for p in raw if p.end > p.start):
        if out and p.end - p.start < MIN_PIECE_S:  # too short to be worth a call: the piece before takes it
            out[-1] = Piece(out[-1].start, p.end, out[-1].prompt)
        elif out and out[-1].end - out[-1].start < MIN_PIECE_S:  # the piece before was too short: this takes it
            out[-1] = Piece(out[-1].start, p.end, p.prompt)
        else:
            out.append(p)
    return out


def correct_with_slides(plain: ASRResult, transcribe: Callable[[np.ndarray, str], ASRResult], audio: np.ndarray,
                        cut: list[Piece], sr: int = SR, *, stop: Callable[[], bool] | None = None) -> ASRResult:
    """``plain`` (the whole file transcribed without prompts) with slide terms corrected: each piece that shows a
    slide is transcribed again with the slide's words as the prompt, and ``correct_terms`` takes from it only
    slide words spelt like the plain words they replace, in the plain segments whose middle falls in the piece.
    ``stop()`` true: the request is running out of time; the rest stays uncorrected (the correction is optional)."""
    segments = list(plain.segments)
    for p in cut:
        if stop is not None and stop():
            break
        idx = [i for i, s in enumerate(segments) if p.start <= (s.start + s.end) / 2 < p.end]
        if not p.prompt or not idx:
            continue
        x = audio[int(p.start * sr):int(p.end * sr)]
        if x.size == 0 or float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) < SILENT_RMS:
            continue
        slide_words = {_norm(w) for w in p.prompt.split()} - {""}
        fixed = correct_terms([segments[i] for i in idx], transcribe(x, p.prompt).text, slide_words)
        for i, seg in zip(idx, fixed, strict=True):
            segments[i] = seg
    return ASRResult(text=" ".join(s.text for s in segments).strip(), language=plain.language, segments=segments,
                     language_probability=plain.language_probability)
