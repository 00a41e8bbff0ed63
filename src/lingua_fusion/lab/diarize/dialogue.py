"""Dialogues with known turns, built from different synthetic voices: Piper's joe (a neural voice) and espeak-ng's
voices (en-us, a male formant voice; en+f3, a female variant). Each turn is one voice's sentence; turns follow each
other after ``pause_s`` (negative: they overlap by that much, mixed). The reference times are each turn's voiced
part (the voice's own lead-in and trailing silence cut), on the 16 kHz timeline of the WAV that is returned.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import numpy as np

from ...config import Settings
from ...media import decode_audio
from ...models.tts import to_wav
from .der import Span

RATE = 16000
VOICES = ("joe", "en-us", "en+f3", "en-gb", "en+m3")
_PIPER: list[object] = []


@dataclass(frozen=True)
class Dialogue:
    wav: bytes
    turns: list[Span]
    texts: list[str]
    duration: float


def speak(voice: str, text: str) -> np.ndarray:
    """16 kHz float32 speech of ``text`` in ``voice`` (joe: Piper, read the same way every time; else espeak-ng)."""
    if voice == "joe":
        from ...models.tts import PiperTTS

        if not _PIPER:
            _PIPER.append(PiperTTS(varied=False))
        pcm, sr = _PIPER[0].synthesize(text, language="en")  # type: ignore[attr-defined]
        wav = to_wav(pcm, sr)
    else:
        wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True,
                             timeout=60).stdout
    audio, _info = decode_audio(wav, Settings().limits, what="audio")
    return audio


def _voiced_bounds(audio: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(audio) > 0.02 * max(1e-6, float(np.abs(audio).max())))
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, 0)


def build(lines: list[tuple[str, str]], pause_s: float = 0.5) -> Dialogue:
    """(voice, text) turns -> a Dialogue; the reference speaker of a turn is its voice's name."""
    clips = []
    for voice, text in lines:
        audio = speak(voice, text)
        a, b = _voiced_bounds(audio)
        clips.append(audio[a:b])
    gap = int(pause_s * RATE)
    total = sum(len(c) for c in clips) + max(0, gap) * len(clips) + RATE
    track = np.zeros(total + RATE, np.float32)
    turns, pos = [], int(0.3 * RATE)
    for (voice, _text), clip in zip(lines, clips, strict=True):
        track[pos:pos + len(clip)] += clip
        turns.append(Span(voice, pos / RATE, (pos + len(clip)) / RATE))
        pos = max(0, pos + len(clip) + gap)
    end = max(int(t.end * RATE) for t in turns) + int(0.3 * RATE)
    track = np.clip(track[:end], -1.0, 1.0)
    return Dialogue(to_wav((track * 32767).astype(np.int16), RATE), turns, [t for _v, t in lines], end / RATE)


def hypothesis(segments: list[dict[str, object]]) -> list[Span]:
    """A result's JSON segments (``start``, ``end``, ``speaker``) as spans; a segment with no speaker is left out
    (it counts as missed speech)."""
    return [Span(str(s["speaker"]), float(s["start"]), float(s["end"]))  # type: ignore[arg-type]
            for s in segments if s.get("speaker")]
