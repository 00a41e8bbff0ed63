"""Sounds that are not speech, for proving that a live stream keeps quiet through them (issue 32, "silence stays
silent"): a microphone's self-noise, a room, applause, music. 16 kHz mono float32, seeded, so a run is repeatable.

Made with sox (``synth``) when it is installed, as a user would make them, and with numpy otherwise (the same kinds,
the same levels): ``make(kind, seconds)`` says which in ``Sound.made_by``. Applause and singing are always numpy:
sox's generators have no random onsets (a crowd's claps are onsets at random times) and no formants (a voice's).

- ``silence``: a microphone's self-noise, white at about -75 dBFS (true digital zeros never reach a live stream).
- ``room``: brown and pink noise with a 50 Hz hum, about -40 dBFS: ventilation, traffic, a projector.
- ``applause``: claps (10 ms bursts of noise, each with its own level and decay) at random times, in waves of a few
  seconds that swell and fade, up to about -18 dBFS.
- ``music``: a pop progression (C G Am F) at 100 bpm: plucked chords on every beat, a bass note, a kick on beats 1
  and 3, a hi-hat on the off-beats and a sawtooth melody with vibrato, about -20 dBFS.
- ``singing``: the music's chords under a voice that sings the melody on vowels ("ah", "ee", "oh"; no words): a
  sawtooth with vibrato through the vowels' first three formants, 0.6 s a note, the voice at -20 dBFS and the
  chords 10 dB under it. The hardest of these: Silero hears a fifth of its windows as speech, so it is what
  reaches Whisper.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from ..types import SR

KINDS = ("silence", "room", "applause", "music", "singing")
BPM = 100
CHORDS = [(48, 52, 55), (43, 47, 50), (45, 48, 52), (41, 45, 48)]  # C, G, Am, F (MIDI notes)
MELODY = [64, 67, 69, 67, 62, 67, 71, 69, 60, 64, 67, 64, 65, 69, 72, 69]  # one note a beat, over four bars


@dataclass(frozen=True)
class Sound:
    kind: str
    audio: np.ndarray  # 16 kHz mono float32
    made_by: str  # "sox" | "numpy"

    @property
    def dbfs(self) -> float:
        """The level (RMS) in dB below full scale."""
        rms = float(np.sqrt(np.mean(self.audio.astype(np.float64) ** 2))) or 1e-12
        return 20 * float(np.log10(rms))


def make(kind: str, seconds: float, seed: int = 0, use_sox: bool | None = None) -> Sound:
    """``seconds`` of ``kind`` (one of ``KINDS``); with sox when ``use_sox`` (None: when sox is installed)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    n = int(seconds * SR)
    if kind in SOX and (use_sox if use_sox is not None else shutil.which("sox") is not None):
        audio = _sox_music(n) if kind == "music" else sox(sox_args(kind, seconds), n)
        return Sound(kind, audio, "sox")
    return Sound(kind, NUMPY[kind](n, np.random.default_rng(seed)), "numpy")


def sox(effects: list[str], n: int) -> np.ndarray:
    """``n`` samples of what ``sox -n`` makes through ``effects`` (repeatable: -R seeds its noise), mono 16 kHz."""
    raw = subprocess.run(["sox", "-R", "-n", "-r", str(SR), "-c", "1", "-b", "16", "-e", "signed-integer", "-t", "raw",
                          "-", *effects], capture_output=True, check=True, timeout=120).stdout
    audio = (np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0)[:n]
    return np.pad(audio, (0, n - len(audio)))


def sox_args(kind: str, seconds: float) -> list[str]:
    """The sox effects that make ``silence`` or ``room`` (after ``sox -n ... -``)."""
    s = f"{seconds:g}"
    if kind == "silence":
        return ["synth", s, "whitenoise", "vol", "0.0005"]
    return ["synth", s, "brownnoise", "synth", s, "pinknoise", "mix", "synth", s, "sine", "mix", "50",
            "lowpass", "3000", "vol", "0.026"]


def _note(midi: int) -> float:
    return float(440.0 * 2 ** ((midi - 69) / 12))


def _sox_music(n: int) -> np.ndarray:
    """The progression's 16 beats, each one sox call (the chord and its bass plucked, the melody's note as a
    sawtooth, a kick as a falling sine on beats 1 and 3), tiled to ``n`` samples at -20 dBFS."""
    beat = f"{60.0 / BPM:.4f}"
    beats = []
    for k, melody in enumerate(MELODY):
        chord = CHORDS[k // 4]
        effects = ["synth", beat, *(w for m in (*chord, chord[0] - 12) for w in ("pluck", f"{_note(m):.2f}")),
                   "sawtooth", f"{_note(melody):.2f}"]
        if k % 2 == 0:
            effects += ["sine", "120-50"]
        beats.append(sox([*effects, "tremolo", "5.5", "20", "fade", "0.005", beat, "0.1"], int(60 / BPM * SR)))
    x = np.tile(np.concatenate(beats), n // (len(beats) * len(beats[0])) + 1)[:n].astype(np.float64)
    return (x / (np.sqrt(np.mean(x ** 2)) or 1.0) * 10 ** (-20 / 20)).astype(np.float32)


def _silence(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal(n) * 10 ** (-75 / 20)).astype(np.float32)


def _colored(n: int, rng: np.random.Generator, exponent: float) -> np.ndarray:
    """Noise whose power falls as 1/f**exponent (1: pink, 2: brown), at unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SR)
    f[0] = f[1]
    x = np.fft.irfft(spectrum / f ** (exponent / 2), n)
    return x / (np.sqrt(np.mean(x ** 2)) or 1.0)


def _room(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n) / SR
    x = 0.6 * _colored(n, rng, 2.0) + 0.4 * _colored(n, rng, 1.0) + 0.3 * np.sin(2 * np.pi * 50 * t)
    return (x / np.sqrt(np.mean(x ** 2)) * 10 ** (-40 / 20)).astype(np.float32)


def _applause(n: int, rng: np.random.Generator) -> np.ndarray:
    """Waves of claps: each wave 3-8 s, swelling then fading (a sine arch of clap density, up to 60 claps/s), with
    0.5-4 s of room between waves; every clap 10 ms of high-passed noise with its own level and decay."""
    out = np.zeros(n, dtype=np.float64)
    clap = int(0.010 * SR)
    t = 0
    while t < n:
        wave = int(rng.uniform(3, 8) * SR)
        claps = int(rng.uniform(20, 60) * wave / SR * 0.64)  # the arch's mean density is 2/pi of its peak
        onsets = t + (np.arccos(1 - 2 * rng.uniform(0, 1, claps)) / np.pi * wave).astype(int)
        for at in onsets[onsets < n - clap]:
            burst = np.diff(rng.standard_normal(clap + 1)) * np.exp(-np.arange(clap) / (clap * rng.uniform(0.1, 0.4)))
            out[at:at + clap] += burst * rng.uniform(0.03, 0.2) * np.sin(np.pi * (at - t) / wave) ** 0.5
        t += wave + int(rng.uniform(0.5, 4) * SR)
    out += _colored(n, rng, 1.0) * 10 ** (-50 / 20)
    return np.clip(out, -1, 1).astype(np.float32)


def _music(n: int, rng: np.random.Generator) -> np.ndarray:
    beat = int(60 / BPM * SR)
    out = np.zeros(n + 4 * beat, dtype=np.float64)
    tb = np.arange(beat) / SR
    pluck_env = np.exp(-tb * 6)
    for k in range(n // beat + 1):
        chord = CHORDS[(k // 4) % 4]
        at = k * beat
        for midi in (*chord, chord[0] - 12):
            f = _note(midi)
            out[at:at + beat] += sum(np.sin(2 * np.pi * h * f * tb) / h ** 1.5 for h in (1, 2, 3, 4)) * pluck_env * 0.15
        if k % 2 == 0:  # kick: a sine falling from 120 to 50 Hz
            out[at:at + beat] += np.sin(2 * np.pi * np.cumsum(50 + 70 * np.exp(-tb * 30)) / SR) * np.exp(-tb * 12) * 0.5
        hat = at + beat // 2
        out[hat:hat + 800] += np.diff(rng.standard_normal(801)) * np.exp(-np.arange(800) / 120) * 0.08
        pitch = _note(MELODY[k % len(MELODY)]) * (1 + 0.006 * np.sin(2 * np.pi * 5.5 * tb))  # vibrato
        phase = np.cumsum(pitch) / SR
        out[at:at + beat] += (2 * (phase % 1) - 1) * np.minimum(1, tb * 20) * np.exp(-tb * 1.5) * 0.12
    x = out[:n]
    return (x / (np.sqrt(np.mean(x ** 2)) or 1.0) * 10 ** (-20 / 20)).astype(np.float32)


VOWELS = [(700, 1220, 2600), (300, 2300, 3000), (570, 840, 2410)]  # formants (Hz) of "ah", "ee", "oh"
SUNG = [57, 59, 60, 62, 64, 62, 60, 59]  # the voice's notes (MIDI), one every NOTE_S
NOTE_S = 0.6


def _formants(x: np.ndarray, formants: tuple[int, ...]) -> np.ndarray:
    """``x`` through resonances at ``formants`` (each a peak 80 Hz + 5% wide, the higher ones quieter)."""
    spectrum, f = np.fft.rfft(x), np.fft.rfftfreq(len(x), 1 / SR)
    gain = sum(1 / (j + 1) / (1 + ((f - fm) / ((80 + 0.05 * fm) / 2)) ** 2) for j, fm in enumerate(formants))
    return np.fft.irfft(spectrum * gain, len(x))


def _singing(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n) / SR
    notes = np.array([_note(m) for m in SUNG])[(t / NOTE_S).astype(int) % len(SUNG)]
    phase = np.cumsum(notes * (1 + 0.02 * np.sin(2 * np.pi * 5.5 * t))) / SR
    source = 2 * (phase % 1) - 1 + 0.02 * rng.standard_normal(n)
    seg = int(NOTE_S * SR)
    voice = np.concatenate([_formants(source[i:i + seg], VOWELS[(i // seg) % len(VOWELS)])
                            for i in range(0, n, seg)])
    voice = voice / (np.sqrt(np.mean(voice ** 2)) or 1.0) * 10 ** (-20 / 20)
    return (voice + _music(n, rng) * 10 ** (-10 / 20)).astype(np.float32)


NUMPY = {"silence": _silence, "room": _room, "applause": _applause, "music": _music, "singing": _singing}
SOX = {"silence", "room", "music"}
