"""A video's slides as ASR context: the audio is transcribed slide by slide, each piece with its own slide's words
as Whisper's prompt (the words of the *current* slide, as a live stream does).

Why pieces and not one prompt for the whole file: Whisper tiny/base given a prompt tends to stop emitting
timestamps, so a whole talk would come back as one 30 s segment; cut at the slide changes, every caption keeps at
least the slide's timing. A cut is moved to the quietest 100 ms within ``SNAP_S`` of the change so that it falls
between words, pieces shorter than ``MIN_PIECE_S`` join the one before, and a silent piece is not transcribed at
all (a prompt over silence makes Whisper recite the prompt). The prompt is the slide's rows as sentences:
a comma list of words made Whisper drop its punctuation and capitalise the listed words in the transcript.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..models.base import ASRResult, ASRSegment
from ..types import SR
from .slide_reader import SlideSpan

SNAP_S = 1.0
MIN_PIECE_S = 2.0
SILENT_RMS = 0.003  # a piece quieter than this (float samples) holds no speech
PROMPT_CHARS = 400  # Whisper's prompt is at most 224 tokens: about this many characters of slide text


@dataclass(frozen=True)
class Piece:
    start: float
    end: float
    prompt: str | None


def prompt_of(slide: SlideSpan) -> str:
    sentences = [r.text.rstrip(" .:;,") + "." for r in slide.rows if r.text.strip()]
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


def transcribe_pieces(transcribe: Callable[[np.ndarray, str | None], ASRResult], audio: np.ndarray,
                      cut: list[Piece], sr: int = SR) -> ASRResult:
    """Transcribe each piece with its prompt; segments come back on the file's timeline."""
    segments: list[ASRSegment] = []
    language, probability = "", None
    for p in cut:
        x = audio[int(p.start * sr):int(p.end * sr)]
        if x.size == 0 or float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) < SILENT_RMS:
            continue
        res = transcribe(x, p.prompt)
        language, probability = language or res.language, probability or res.language_probability
        for s in res.segments:
            segments.append(ASRSegment(start=round(p.start + s.start, 3), end=round(min(p.end, p.start + s.end), 3),
                                       text=s.text, confidence=s.confidence))
    return ASRResult(text=" ".join(s.text for s in segments).strip(), language=language, segments=segments,
                     language_probability=probability)
